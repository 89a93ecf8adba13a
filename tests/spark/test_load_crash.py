"""Exactly once across crashes: `dcmirror load` processes (with their Spark JVM) are killed
with SIGKILL, between rounds of new records, and a final load leaves every record in the
tables exactly once, with a ledger that accounts for each.

A seed decides one run: a kill at each step of the load (`DCMIRROR_LOAD_CRASH_AT`: after
planning, after a topic's data is written to staging, after staging, after the n-th file
is published, after publishing, after the commit) and one at a random moment after the
load's Spark session is up, in an order the seed shuffles; the records of each round; n.
Every seed kills at every step, so the seeds differ in order, n, moment and records.

`make test` runs the fixed seeds in SEEDS. `make soak` draws new seeds
(DCMIRROR_SOAK_CRASH_RUNS runs, default 5) and prints each. Replay one seed, in place of
SEEDS: DCMIRROR_CRASH_SEED=<seed> pytest tests/spark/test_load_crash.py -s.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import REPO, BrokerProcess
from tests.spark.common import Feed, create_topics, sql_json, write_topology

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(1500)]

STEPS = ["planned", "stage-written", "staged", "publish-file", "published", "committed"]
TOPICS = {"c.east.pageviews": 3, "c.local": 1}
TABLES = {"c.east.pageviews": "c_east_pageviews", "c.local": "c_local"}
SEEDS = [int(os.environ["DCMIRROR_CRASH_SEED"])] if os.environ.get("DCMIRROR_CRASH_SEED") else [5]
TIMED_ATTEMPTS = 3  # a load that finishes before its random moment is tried again, sooner


def java_options(archive: Path, *, dump: bool) -> str:
    """The Spark JVMs' options: each lives less than a minute, starting is most of its work.
    C1 alone compiles enough for that (tiered compilation's C2 burns CPU that never pays
    back), and the classes the clean load loaded (Spark, Hive, Derby: ~15,000) are mapped
    from a CDS archive it writes at its exit instead of parsed and verified again by each
    later JVM. A load's CPU: ~45 s with the defaults, ~27 s with C1, ~17 s with both. A
    missing or unusable archive only makes the JVM slower (-Xshare:auto)."""
    cds = f"-XX:ArchiveClassesAtExit={archive}" if dump else f"-XX:SharedArchiveFile={archive}"
    return f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC {cds} -Xlog:cds=off -Xlog:cds+dynamic=off"


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


@dataclass
class Ran:
    returncode: int
    out: str
    seconds: float  # to its exit
    session_s: float | None  # to its line saying its Spark session is up ("loading ...")
    loaded_s: float | None  # to its last line ("loaded ... rows in ...")


def run_load(topology: Path, crash_at: str | None = None, *, kill_after_session_s: float | None = None) -> Ran:
    """One `dcmirror load`, killed at step `crash_at` (it kills itself), or `kill_after_session_s`
    after its Spark session is up (this kills its process group). Returns once every process
    of its group is gone (the output pipe they share is closed), so the next load never meets
    a dying JVM's metastore."""
    proc = start_load(topology, crash_at)
    started = time.monotonic()
    lines: list[str] = []
    marks: dict[str, float] = {}
    session_up = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            for mark in ("loading ", "loaded "):
                if line.startswith(mark):
                    marks.setdefault(mark, time.monotonic() - started)
            if "loading " in marks:
                session_up.set()
            lines.append(line)
        session_up.set()  # ended without one

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if kill_after_session_s is not None and session_up.wait(600) and "loading " in marks:
            try:
                proc.wait(timeout=kill_after_session_s)
            except subprocess.TimeoutExpired:
                kill_group(proc)
        proc.wait(timeout=600)
        seconds = time.monotonic() - started
    except BaseException:
        kill_group(proc)
        raise
    if proc.returncode == -signal.SIGKILL:
        kill_group(proc)  # a load that killed itself leaves its JVM and Python workers behind
    # (a load that ended by itself stopped its JVM, which may still be writing its CDS archive)
    reader.join(300)  # a JVM writing its CDS archive at exit takes a while
    assert not reader.is_alive(), "a load's processes still hold its output open 300 s after it ended"
    return Ran(proc.returncode, "".join(lines), seconds, marks.get("loading "), marks.get("loaded "))


def rows_loaded(out: str) -> int:
    """The rows a finished load says it loaded ("loaded 1,234 rows in 2 load(s), ...")."""
    found = re.search(r"^loaded ([\d,]+) rows in ", out, re.M)
    assert found, out
    return int(found.group(1).replace(",", ""))


def kill_plan(rng: random.Random) -> list[str | None]:
    """The kills of a run in order: every step (publish-file at the 1st-3rd file) and None,
    a kill at a random moment."""
    kills: list[str | None] = [f"{s}:{rng.randint(1, 3)}" if s == "publish-file" else s for s in STEPS]
    kills.append(None)
    rng.shuffle(kills)
    return kills


def crash_run(tmp_path: Path, seed: int) -> None:
    print(f"crash test seed {seed} (replay: DCMIRROR_CRASH_SEED={seed})")
    rng = random.Random(seed)
    kills = kill_plan(rng)
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        create_topics(broker.bootstrap, TOPICS)
        archive = tmp_path / "spark-classes.jsa"

        def topology_with(*, dump: bool) -> Path:
            return write_topology(tmp_path / "topology.toml", broker.bootstrap, tmp_path / "warehouse",
                                  topics=r"c\..*", config={"minPartitions": 3, "spark.driver.extraJavaOptions":
                                                           java_options(archive, dump=dump)})

        topology = topology_with(dump=True)
        feed = Feed(broker.bootstrap)

        def more_records() -> None:
            feed.produce("c.east.pageviews", 3, rng.randrange(300, 1500), source="east", fence_every=97)
            feed.produce("c.local", 1, rng.randrange(10, 100), source=None)

        # A clean load first: the CLI contract (summary table, exit 0) and how long a load takes.
        more_records()
        ran = run_load(topology)
        assert ran.returncode == 0, ran.out
        assert "dcmirror.c_east_pageviews" in ran.out and "total" in ran.out and "rows/s" in ran.out
        assert ran.session_s is not None and ran.loaded_s is not None, ran.out
        working_s = ran.loaded_s - ran.session_s  # from its Spark session up to its end
        topology = topology_with(dump=False)
        # The load's Prometheus textfile (node_exporter's textfile collector serves it).
        metrics = load_metrics(tmp_path / "warehouse")
        assert metrics['dcmirror_load_runs_total{source="aggregate",result="ok"}'] == 1
        assert metrics['dcmirror_load_runs_total{source="aggregate",result="failed"}'] == 0
        assert metrics['dcmirror_load_rows_total{source="aggregate"}'] == len(feed.sent) == rows_loaded(ran.out)
        assert metrics['dcmirror_load_last_run_success{source="aggregate"}'] == 1
        assert 0 < metrics['dcmirror_load_last_duration_seconds{source="aggregate"}'] < ran.seconds
        assert abs(metrics['dcmirror_load_last_success_timestamp_seconds{source="aggregate"}'] - time.time()) < 60
        finished_ok = 1
        rows_of_finished = rows_loaded(ran.out)
        ok_key, rows_key = ('dcmirror_load_runs_total{source="aggregate",result="ok"}',
                            'dcmirror_load_rows_total{source="aggregate"}')
        counted = (metrics[ok_key], metrics[rows_key])

        log: list[str] = []
        lived_s: list[float] = []
        for kill in kills:
            for attempt in range(1 if kill is not None else TIMED_ATTEMPTS):
                more_records()
                if kill is not None:
                    ran = run_load(topology, kill)
                    what = f"step {kill}"
                else:
                    # Anywhere from the metastore's first use to the publish and the commit
                    # (as long as the longest load killed at a step lived after its session
                    # was up, else the clean load); one that finished first: a new one sooner.
                    delay_s = rng.uniform(0.05, 0.9) * max(lived_s or [working_s]) / (2 ** attempt)
                    ran = run_load(topology, kill_after_session_s=delay_s)
                    what = f"{delay_s:.1f} s after its session was up"
                died = ran.returncode == -signal.SIGKILL
                if kill is not None and died and ran.session_s is not None:
                    lived_s.append(ran.seconds - ran.session_s)
                now = load_metrics(tmp_path / "warehouse")
                finished_late = died and now[ok_key] > counted[0]
                if finished_late:
                    # A timed kill that landed after the load had finished (its metrics
                    # written, the process on its way out): it counts as the finished load it is.
                    finished_ok += 1
                    rows_of_finished += int(now[rows_key] - counted[1])
                counted = (now[ok_key], now[rows_key])
                log.append(f"round {len(log)}: kill at {what}: "
                           f"{'killed' if died else f'exit {ran.returncode}'}"
                           f"{' after it had finished' if finished_late else ''} ({ran.seconds:.0f} s)")
                assert died or ran.returncode == 0, f"seed {seed}, {log[-1]}:\n{ran.out}"
                if died:
                    break
                finished_ok += 1
                rows_of_finished += rows_loaded(ran.out)
            # Every load reaches every step (each has new records, in 4 or more staged files).
            assert died, f"seed {seed}: no load was killed at {what}:\n" + "\n".join(log) + f"\n{ran.out}"
        print("\n".join(log))

        ran = run_load(topology)
        assert ran.returncode == 0, f"seed {seed}: the final load failed:\n{ran.out}"
        metrics = load_metrics(tmp_path / "warehouse")  # killed loads count nowhere (but one killed after it
        # had finished, above); the others once each
        assert metrics['dcmirror_load_runs_total{source="aggregate",result="ok"}'] == finished_ok + 1, (seed, metrics)
        assert metrics['dcmirror_load_runs_total{source="aggregate",result="failed"}'] == 0
        assert metrics['dcmirror_load_rows_total{source="aggregate"}'] == rows_of_finished + rows_loaded(ran.out)

        # Tables and ledger from a fresh session (not the final load's), in one query: one JVM.
        record = "named_struct('p', kafka_partition, 'o', kafka_offset, 's', source_offset, 'v', value)"
        ledger_row = ("named_struct('load_id', load_id, 'topic', topic, 'partition', partition, 'start_offset', "
                      "start_offset, 'end_offset', end_offset, 'rows', rows, 'status', status)")
        [found] = sql_json(topology, "SELECT " + ", ".join(
            [f"(SELECT collect_list({record}) FROM {table}) AS {table}" for table in TABLES.values()]
            + [f"(SELECT collect_list({ledger_row}) FROM loads) AS ledger"]))
        for topic, table in TABLES.items():
            rows = [dict(zip("posv", r, strict=True)) for r in found[table]]  # structs come as lists
            seen = Counter((r["p"], r["o"]) for r in rows)
            twice = [k for k, n in seen.items() if n > 1]
            assert not twice, f"seed {seed}: {topic} holds records more than once: {twice[:10]}"
            sent = {(s.partition, s.offset): s for s in feed.sent if s.topic == topic}
            assert set(seen) == set(sent), (f"seed {seed}: {topic}: missing {sorted(set(sent) - set(seen))[:10]}, "
                                            f"unexpected {sorted(set(seen) - set(sent))[:10]}")
            for r in rows:
                s = sent[(r["p"], r["o"])]
                assert (r["s"], r["v"].encode()) == (s.source_offset, s.value), f"seed {seed}: {topic} {r}"
        ledger = [dict(zip(("load_id", "topic", "partition", "start_offset", "end_offset", "rows", "status"), r,
                           strict=True)) for r in found["ledger"]]
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


@pytest.mark.parametrize("seed", SEEDS)
def test_loads_killed_at_every_step_and_a_random_moment_leave_every_record_once(tmp_path: Path, seed: int) -> None:
    crash_run(tmp_path, seed)


@pytest.mark.soak
@pytest.mark.timeout(0)
def test_soak_new_seeds(tmp_path: Path) -> None:
    """New seeds each time (make soak; DCMIRROR_SOAK_CRASH_RUNS runs, default 5), each printed
    before it runs: a failure replays with DCMIRROR_CRASH_SEED=<seed>."""
    for run in range(int(os.environ.get("DCMIRROR_SOAK_CRASH_RUNS", "5"))):
        crash_run(tmp_path / f"run-{run}", random.randrange(1 << 30))
