"""`dcmirror perf produce|consume` against a real broker: exact record counts in the JSON
summaries and in the log, throttling, progress lines, exit codes; and the bookkeeping
(percentiles, throttler) as plain objects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deploy.perf_stats import (
    LATENCY_SAMPLE_EVERY,
    ConsumerStats,
    ProducerStats,
    Throttler,
    percentiles,
)
from tests.cluster_helpers import create_topic
from tests.harness import REPO, BrokerProcess
from tests.mirror.lab import end_offsets


def perf(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", "perf", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout_s)


def summary(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.stdout.count("\n") == 1, proc.stdout  # --json: stdout is the summary alone
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    proc = BrokerProcess(tmp_path_factory.mktemp("perf") / "broker").start()
    create_topic(proc.bootstrap, "perf", 3, 1)
    yield proc
    proc.stop()


def test_produce_then_consume_exact_counts(broker: BrokerProcess, tmp_path: Path) -> None:
    n, size = 20_000, 100
    p = perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "perf", "--num-records", str(n),
             "--record-size", str(size), "--producer-props", "linger.ms=5", "acks=all", "--json")
    assert p.returncode == 0, p.stderr
    s = summary(p)
    assert (s["records"], s["errors"], s["bytes"]) == (n, 0, n * size)
    assert s["latency_samples"] == n // LATENCY_SAMPLE_EVERY + (n % LATENCY_SAMPLE_EVERY > 0)
    assert 0 < s["p50_ms"] <= s["p95_ms"] <= s["p99_ms"] <= s["p999_ms"] <= s["max_latency_ms"]
    assert s["records_per_sec"] > 0 and s["mb_per_sec"] > 0
    assert sum(end_offsets(broker.bootstrap, "perf").values()) == n
    print(f"perf produce: {s['records_per_sec']:.0f} records/s, {s['mb_per_sec']:.1f} MB/s, "
          f"p99 {s['p99_ms']} ms")

    # Every partition assigned, no group.
    c = perf("consume", "--bootstrap-server", broker.bootstrap, "--topic", "perf", "--messages", str(n), "--json")
    assert c.returncode == 0, c.stderr
    s = summary(c)
    assert (s["records"], s["bytes"], s["rebalance_time_ms"]) == (n, n * size, 0)
    print(f"perf consume: {s['records_per_sec']:.0f} records/s, {s['mb_per_sec']:.1f} MB/s")

    # As a consumer group, the cluster named through a topology file.
    topology = tmp_path / "topology.toml"
    topology.write_text(f'[clusters.one]\ndatacenter = "here"\nbrokers = ["{broker.bootstrap}"]\n')
    g = perf("consume", "--config", str(topology), "--cluster", "one", "--topic", "perf", "--messages", str(n),
             "--group", "perf-group", "--consumer-props", "fetch.max.wait.ms=100")
    assert g.returncode == 0, g.stderr
    header, row = g.stdout.strip().splitlines()[-2:]
    assert header.startswith("start.time, end.time, data.consumed.in.MB")
    fields = [f.strip() for f in row.split(",")]
    assert fields[4] == str(n) and float(fields[2]) == pytest.approx(n * size / 2**20, abs=1e-4)
    assert int(fields[6]) > 0  # joining the group took time

    # More records than there are: the consumer gives up after --timeout, having read them all.
    t = perf("consume", "--bootstrap-server", broker.bootstrap, "--topic", "perf", "--messages", str(n + 1),
             "--timeout", "1500", "--json")
    assert t.returncode == 1
    assert summary(t)["records"] == n
    assert "1500 ms passed without one" in t.stderr


def test_throughput_limit_and_progress_lines(broker: BrokerProcess) -> None:
    p = perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "perf", "--num-records", "300",
             "--record-size", "10", "--throughput", "200", "--reporting-interval", "400")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    progress, final = lines[:-1], lines[-1]
    assert len(progress) >= 2, p.stdout  # 1.5 s at 200 records/s, a line every 0.4 s
    assert all(" records sent, " in line and "ms max latency." in line for line in progress)
    assert final.startswith("300 records sent, ") and "ms 99.9th." in final
    rate = float(final.split(", ")[1].split(" ")[0])
    assert 150 <= rate <= 205, final  # Kafka's throttler: never ahead of the target


def test_usage_errors(broker: BrokerProcess) -> None:
    bad = perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "perf", "--num-records", "1",
               "--producer-props", "lingr.ms=5")
    assert bad.returncode == 2 and "did you mean 'linger.ms'" in bad.stderr
    none = perf("consume", "--topic", "perf", "--messages", "1")
    assert none.returncode == 2 and "--bootstrap-server" in none.stderr
    missing = perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "nope", "--num-records", "1",
                   "--producer-props", "max.block.ms=1000")
    assert missing.returncode == 1 and "create it first: dcmirror topics create nope" in missing.stderr
    pair = perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "perf", "--num-records", "1",
                "--producer-props", "linger.ms")
    assert pair.returncode == 2 and "KEY=VALUE" in pair.stderr


def test_percentiles_and_throttler() -> None:
    values = [float(v) for v in range(1000, 0, -1)]
    assert percentiles(values) == [501.0, 951.0, 991.0, 1000.0]  # sorted[int(p * n)], as Kafka
    assert percentiles([]) == [0.0, 0.0, 0.0, 0.0]
    t = Throttler(100)
    assert t.delay_s(50, 0.2) == pytest.approx(0.3)
    assert t.delay_s(50, 0.6) == 0.0
    assert Throttler(-1).delay_s(10**9, 0.0) == 0.0


def test_producer_stats_windows() -> None:
    s = ProducerStats(num_records=100, record_size=1000, start_s=10.0)
    assert [i for i in range(100) if s.samples(i)] == list(range(0, 100, LATENCY_SAMPLE_EVERY))
    for ms in (4.0, 8.0):
        s.latency(ms)
    s.update(acked=60, errors=0)
    assert s.progress_line(12.0) == ("60 records sent, 30.0 records/sec (0.03 MB/sec), 6.0 ms avg latency, "
                                     "8.0 ms max latency.")
    s.latency(2.0)
    s.update(acked=100, errors=0)
    assert s.progress_line(14.0).startswith("40 records sent, 20.0 records/sec")
    out = s.summary(15.0)
    assert (out["records"], out["bytes"], out["max_latency_ms"], out["avg_latency_ms"]) == (100, 100_000, 8.0, 4.67)
    assert out["records_per_sec"] == 20.0


def test_consumer_stats_summary() -> None:
    c = ConsumerStats(start_s=100.0)
    c.consumed(0, 0, 100.5)
    c.consumed(10, 1000, 101.0)
    c.consumed(30, 3000, 104.0)
    out = c.summary(rebalance_s=2.0, now_s=200.0, start_wall_s=1_000.0)
    assert (out["records"], out["bytes"], out["records_per_sec"], out["fetch_records_per_sec"]) == (40, 4000, 10.0, 20.0)
    assert (out["start_time_ms"], out["end_time_ms"], out["fetch_time_ms"]) == (1_000_000, 1_004_000, 2000)
