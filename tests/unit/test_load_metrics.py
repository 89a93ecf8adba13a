"""The warehouse load's Prometheus textfile (spark_aggregate/load_metrics.py): counters carry
on across runs and survive a garbled file, the last success outlives failures, the file is
replaced atomically, and a directory that cannot be written costs a warning, not the load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spark_aggregate.load_metrics import (
    TEXTFILE_NAME,
    load_metrics_text,
    textfile_path,
    write_load_metrics,
)


def samples(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))}


def test_counters_carry_on_and_the_last_success_outlives_a_failure() -> None:
    first = load_metrics_text({"status": "ok", "seconds": 12.5, "rows": 100}, "", source="agg", interval_s=300,
                              now_s=1000.0)
    failed = load_metrics_text({"status": "failed", "seconds": 2.0}, first, source="agg", interval_s=300,
                               now_s=2000.0)
    third = load_metrics_text({"status": "ok", "seconds": 3, "rows": 7}, failed, source="agg", interval_s=300,
                              now_s=3000.5)
    assert samples(failed) == {
        'dcmirror_load_runs_total{source="agg",result="ok"}': 1,
        'dcmirror_load_runs_total{source="agg",result="failed"}': 1,
        'dcmirror_load_rows_total{source="agg"}': 100,
        'dcmirror_load_last_run_timestamp_seconds{source="agg"}': 2000,
        'dcmirror_load_last_run_success{source="agg"}': 0,
        'dcmirror_load_last_success_timestamp_seconds{source="agg"}': 1000,
        'dcmirror_load_last_duration_seconds{source="agg"}': 2,
        'dcmirror_load_last_rows{source="agg"}': 0,
        'dcmirror_load_interval_seconds{source="agg"}': 300,
    }
    got = samples(third)
    assert got['dcmirror_load_runs_total{source="agg",result="ok"}'] == 2
    assert got['dcmirror_load_rows_total{source="agg"}'] == 107
    assert got['dcmirror_load_last_success_timestamp_seconds{source="agg"}'] == 3000.5
    assert got['dcmirror_load_last_run_success{source="agg"}'] == 1


def test_a_never_successful_load_has_no_success_time_and_garbage_restarts_the_counters() -> None:
    text = load_metrics_text({"status": "failed"}, "garbage\ndcmirror_load_rows_total{source=\"agg\"} NaN\n"
                             'dcmirror_load_runs_total{source="other",result="ok"} 9\n', source="agg",
                             interval_s=0, now_s=10.0)
    got = samples(text)
    assert not any(k.startswith("dcmirror_load_last_success_timestamp_seconds{") for k in got)
    assert got['dcmirror_load_runs_total{source="agg",result="ok"}'] == 0  # another source's count is not ours
    assert got['dcmirror_load_runs_total{source="agg",result="failed"}'] == 1
    assert got['dcmirror_load_rows_total{source="agg"}'] == 0


def test_the_file_is_replaced_whole_and_an_unwritable_directory_is_only_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = textfile_path(tmp_path / "warehouse", {})
    assert path == tmp_path / "warehouse" / TEXTFILE_NAME
    assert textfile_path(tmp_path, {"load.metrics.textfile.dir": "/var/lib/prometheus/node-exporter"}) == \
        Path("/var/lib/prometheus/node-exporter") / TEXTFILE_NAME
    assert write_load_metrics(path, {"status": "ok", "seconds": 1, "rows": 5}, source="agg", interval_s=0, now_s=1)
    inode = os.stat(path).st_ino
    assert write_load_metrics(path, {"status": "ok", "seconds": 1, "rows": 5}, source="agg", interval_s=0, now_s=2)
    assert os.stat(path).st_ino != inode, "rewritten in place: a scrape could read half a file"
    assert samples(path.read_text())['dcmirror_load_rows_total{source="agg"}'] == 10
    assert sorted(p.name for p in path.parent.iterdir()) == [TEXTFILE_NAME]  # no temporary left

    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the directory should be")
    assert not write_load_metrics(blocked / TEXTFILE_NAME, {"status": "ok"}, source="agg", interval_s=0, now_s=1)
    assert "load metrics: cannot write" in caplog.text
