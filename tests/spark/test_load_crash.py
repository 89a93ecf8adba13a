"""Exactly once across crashes: `dcmirror load` processes (with their Spark JVM) are killed
with SIGKILL at seeded random moments, between rounds of new records, and a final load
leaves every record in the tables exactly once, with a ledger that accounts for each.

Kill moments come from the seed: either a random time into the run, or a random step of
the load (`DCMIRROR_LOAD_CRASH_AT`: after planning, after a topic's data is written to
staging, after staging, after a file is published, after publishing, after the commit).
Replay a failure with DCMIRROR_CRASH_SEED=<seed printed by the test>.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.harness import REPO, BrokerProcess
from tests.spark.common import Feed, create_topics, sql_json, write_topology

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(1500)]

STEPS = ["planned", "stage-written", "staged", "publish-file", "published", "committed"]
TOPICS = {"c.east.pageviews": 3, "c.local": 1}


def start_load(topology: Path, crash_at: str | None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("DCMIRROR_LOAD_CRASH_AT", None)
    if crash_at:
        env["DCMIRROR_LOAD_CRASH_AT"] = crash_at
    # Its own process group: the kill takes the Spark JVM (and Python workers) with it.
    return subprocess.Popen([sys.executable, "-m", "deploy.cli", "--log-level", "WARNING", "load", "--config",
                             str(topology)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def load_metrics(warehouse: Path) -> dict[str, float]:
    """The samples of <warehouse>/dcmirror_load.prom, by their name and labels."""
    lines = (warehouse / "dcmirror_load.prom").read_text().splitlines()
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in lines if not line.startswith("#"))}


def kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_loads_killed_at_random_moments_leave_every_record_once(tmp_path: Path) -> None:
    seed = int(os.environ.get("DCMIRROR_CRASH_SEED") or random.randrange(1 << 30))
    print(f"crash test seed {seed} (replay: DCMIRROR_CRASH_SEED={seed})")
    rng = random.Random(seed)
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        create_topics(broker.bootstrap, TOPICS)
        topology = write_topology(tmp_path / "topology.toml", broker.bootstrap, tmp_path / "warehouse",
                                  topics=r"c\..*", config={"minPartitions": 3})
        feed = Feed(broker.bootstrap)

        def more_records() -> None:
            feed.produce("c.east.pageviews", 3, rng.randrange(300, 1500), source="east", fence_every=97)
            feed.produce("c.local", 1, rng.randrange(10, 100), source=None)

        # A clean load first: the CLI contract (summary table, exit 0) and how long a load takes.
        more_records()
        started = time.monotonic()
        proc = start_load(topology, None)
        out, _ = proc.communicate(timeout=600)
        full_s = time.monotonic() - started
        assert proc.returncode == 0, out
        assert "dcmirror.c_east_pageviews" in out and "total" in out and "rows/s" in out
        # The load's Prometheus textfile (node_exporter's textfile collector serves it).
        metrics = load_metrics(tmp_path / "warehouse")
        assert metrics['dcmirror_load_runs_total{source="aggregate",result="ok"}'] == 1
        assert metrics['dcmirror_load_runs_total{source="aggregate",result="failed"}'] == 0
        assert metrics['dcmirror_load_rows_total{source="aggregate"}'] == len(feed.sent)
        assert metrics['dcmirror_load_last_run_success{source="aggregate"}'] == 1
        assert 0 < metrics['dcmirror_load_last_duration_seconds{source="aggregate"}'] < full_s
        assert abs(metrics['dcmirror_load_last_success_timestamp_seconds{source="aggregate"}'] - time.time()) < 60
        finished_ok = 1

        kills = 0
        log = []
        round_ = 0
        while kills < 5 and round_ < 12:  # five kills (the minimum): each is a Spark start
            more_records()
            if round_ % 2 == 0:
                step = rng.choice(STEPS)
                crash_at = f"{step}:{rng.randint(1, 3)}" if step == "publish-file" else step
                proc = start_load(topology, crash_at)
                try:
                    out, _ = proc.communicate(timeout=600)
                finally:
                    kill_group(proc)
                what = f"step {crash_at}"
            else:
                delay_s = rng.uniform(0.2, 0.8) * full_s
                proc = start_load(topology, None)
                started = time.monotonic()
                try:
                    out, _ = proc.communicate(timeout=delay_s)
                    # Finished first: later loads are faster than the first (a warm disk
                    # cache, an idle machine); aim the next timed kills at this one's length.
                    full_s = min(full_s, time.monotonic() - started)
                except subprocess.TimeoutExpired:
                    kill_group(proc)
                    out, _ = proc.communicate(timeout=60)
                what = f"{delay_s:.1f} s in"
            died = proc.returncode == -signal.SIGKILL
            kills += died
            finished_ok += proc.returncode == 0
            log.append(f"round {round_}: kill at {what}: {'killed' if died else f'exit {proc.returncode}'}")
            assert died or proc.returncode == 0, f"seed {seed}, {log[-1]}:\n{out}"
            round_ += 1
        print("\n".join(log))
        assert kills >= 5, f"seed {seed}: only {kills} loads were killed:\n" + "\n".join(log)

        proc = start_load(topology, None)
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"seed {seed}: the final load failed:\n{out}"
        metrics = load_metrics(tmp_path / "warehouse")  # killed loads count nowhere; the others once each
        assert metrics['dcmirror_load_runs_total{source="aggregate",result="ok"}'] == finished_ok + 1, (seed, metrics)
        assert metrics['dcmirror_load_runs_total{source="aggregate",result="failed"}'] == 0

        for topic, table in (("c.east.pageviews", "c_east_pageviews"), ("c.local", "c_local")):
            rows = sql_json(topology, f"SELECT kafka_partition AS p, kafka_offset AS o, source_offset AS s, value AS v, "
                                      f"load_id FROM {table}")
            seen = Counter((r["p"], r["o"]) for r in rows)
            twice = [k for k, n in seen.items() if n > 1]
            assert not twice, f"seed {seed}: {topic} holds records more than once: {twice[:10]}"
            sent = {(s.partition, s.offset): s for s in feed.sent if s.topic == topic}
            assert set(seen) == set(sent), (f"seed {seed}: {topic}: missing {sorted(set(sent) - set(seen))[:10]}, "
                                            f"unexpected {sorted(set(seen) - set(sent))[:10]}")
            for r in rows:
                s = sent[(r["p"], r["o"])]
                assert (r["s"], r["v"].encode()) == (s.source_offset, s.value), f"seed {seed}: {topic} {r}"
        ledger = sql_json(topology, "SELECT load_id, topic, partition, start_offset, end_offset, rows, status "
                                    "FROM loads")
        committed = [r for r in ledger if r["status"] == "committed"]
        assert {r["load_id"] for r in ledger} == {r["load_id"] for r in committed}, f"seed {seed}: uncommitted loads"
        for topic, partitions in TOPICS.items():
            for p in range(partitions):
                spans = sorted((r["start_offset"], r["end_offset"]) for r in committed
                               if r["topic"] == topic and r["partition"] == p)
                assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)), f"seed {seed}: {spans}"
                data = sum(1 for s in feed.sent if s.topic == topic and s.partition == p)
                assert sum(r["rows"] for r in committed if r["topic"] == topic and r["partition"] == p) == data
    finally:
        broker.stop()
