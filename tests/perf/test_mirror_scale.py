"""A mirror flow of thousands of partitions: the dcmirror worker beside MirrorMaker 2 (one
task) between the same two single-broker dcmirror clusters, then MM2 between two Kafka 4.3.1
clusters as its users run it.

Per mirror, on topics of its own (T topics of 100 partitions, RF 1, on the source):
  1. start-up: N records preloaded, spread over every partition (record i to partition i mod
     P); the mirror starts; seconds until it created every target topic, and until a
     read_committed consumer of the target reads its first record;
  2. bulk: records/s from the first mirrored record read to the last (all N);
  3. a worker restart: the mirror is killed with SIGKILL, M more records are written, the
     mirror starts again; seconds from that start until all N + M are on the target, and how
     many are there (the dcmirror worker: exactly N + M, its flow is exactly once; MM2 is at
     least once, its duplicates are counted).
Knobs: DCMIRROR_BENCH_MIRROR_PARTITIONS (default 5,000), DCMIRROR_BENCH_MIRROR_RECORDS
(default 200,000), DCMIRROR_BENCH_MIRROR_RESTART_RECORDS (default 50,000). One round each.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.harness import ClusterProcesses
from tests.peers.kafka import KAFKA_VERSION
from tests.perf.benchlib import consumer_conf, emit, env_int, progress
from tests.perf.test_mirror_vs_mm2 import start_dcmirror, start_mm2, stop_process, topology
from tests.perf.test_scale import TOPIC_PARTITIONS, create_all, delete_all, produce_spread

pytestmark = pytest.mark.perf


def topics_named(prefix: str, partitions: int) -> list[str]:
    return [f"{prefix}-{i:03d}" for i in range(max(1, partitions // TOPIC_PARTITIONS))]


def wait_topics(admin: AdminClient, topics: list[str], timeout_s: float = 1800) -> None:
    """Until every one of `topics` exists with all its partitions (the mirror creates them)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        present = admin.list_topics(timeout=30).topics
        if all(t in present and len(present[t].partitions) == TOPIC_PARTITIONS for t in topics):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the mirror did not create {len(topics)} topics in {timeout_s:.0f} s")


class TargetCounter:
    """Counts the records a read_committed consumer reads from every partition of the mirrored
    topics, from offset 0 (high watermarks would count a transactional mirror's commit
    markers too): when the first came and when a count was reached."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.count = 0
        self.first_at: float | None = None
        self.reached: dict[int, float] = {}
        self._want: list[int] = []
        self._stop = threading.Event()
        self._consumer = Consumer(consumer_conf(bootstrap, **{"isolation.level": "read_committed"}))
        self._consumer.assign([TopicPartition(t, q, 0) for t in topics for q in range(TOPIC_PARTITIONS)])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            got = sum(1 for msg in self._consumer.consume(10_000, 0.2) if msg.error() is None)
            if got:
                now = time.monotonic()
                if self.first_at is None:
                    self.first_at = now
                self.count += got
                for want in self._want:
                    if self.count >= want and want not in self.reached:
                        self.reached[want] = now

    def wait(self, count: int, timeout_s: float = 1800) -> float:
        """The moment `count` records had been read."""
        self._want.append(count)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.count >= count:
                return self.reached.get(count, time.monotonic())
            time.sleep(0.05)
        raise TimeoutError(f"{self.count:,} of {count:,} records on the target after {timeout_s:.0f} s")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._consumer.close()


def run_flow(name: str, root: Path, source: Any, target: Any, prefix: str,
             start: Callable[[Path, Any, Any, str], subprocess.Popen[Any]], partitions: int, n: int,
             m: int) -> dict[str, float]:
    topics = topics_named(prefix, partitions)
    create_all(source.bootstrap, topics)
    produce_spread(source.bootstrap, topics, n)
    progress(f"{name}: {n:,} records preloaded into {len(topics) * TOPIC_PARTITIONS:,} partitions")
    admin = AdminClient({"bootstrap.servers": target.bootstrap})
    mirrored = [f"source.{t}" for t in topics]
    started = time.monotonic()
    proc = start(root, source, target, f"{prefix}-.*")
    counter = None
    try:
        wait_topics(admin, mirrored)
        topics_s = time.monotonic() - started
        counter = TargetCounter(target.bootstrap, mirrored)
        done = counter.wait(n)
        assert counter.first_at is not None
        figures = {"topics_s": topics_s, "start_s": counter.first_at - started,
                   "rate": n / max(done - counter.first_at, 1e-9)}
        progress(f"{name}: target topics after {topics_s:.1f} s, first record after {figures['start_s']:.1f} s, "
                 f"{figures['rate']:,.0f} records/s")
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        produce_spread(source.bootstrap, topics, m, first=n)
        started = time.monotonic()
        proc = start(root, source, target, f"{prefix}-.*")
        figures["restart_s"] = counter.wait(n + m) - started
        time.sleep(5)  # what a mirror copies again shows a little later
        figures["after_restart"] = counter.count
        progress(f"{name}: all {n + m:,} after the restart in {figures['restart_s']:.1f} s "
                 f"({figures['after_restart']:,} read from the target)")
        return figures
    finally:
        if counter is not None:
            counter.close()
        stop_process(proc)


@pytest.mark.timeout(4 * 3600)
def test_a_mirror_flow_of_thousands_of_partitions_beside_mirrormaker2(tmp_path: Path) -> None:
    from tests.peers.kafka import KafkaCluster
    from tests.perf.test_vs_kafka import BENCH_BROKER_CONFIG

    partitions = env_int("DCMIRROR_BENCH_MIRROR_PARTITIONS", 5_000)
    n = env_int("DCMIRROR_BENCH_MIRROR_RECORDS", 200_000)
    m = env_int("DCMIRROR_BENCH_MIRROR_RESTART_RECORDS", 50_000)
    results: dict[str, dict[str, float]] = {}
    source = ClusterProcesses(tmp_path / "source", 1, name="source", **BENCH_BROKER_CONFIG).start()
    target = ClusterProcesses(tmp_path / "target", 1, name="target", **BENCH_BROKER_CONFIG).start()
    try:
        results["dc"] = run_flow("dcmirror worker", tmp_path, source, target, "wide", start_dcmirror, partitions,
                                 n, m)
        # Each mirror on topics of its own, the other's gone: a broker holds three descriptors
        # per partition with index entries (log, offset and time index; Kafka one, its indexes
        # are mapped), and two flows of 5,000 would pass this machine's 20,000.
        delete_all(source.bootstrap, topics_named("wide", partitions))
        delete_all(target.bootstrap, [f"source.{t}" for t in topics_named("wide", partitions)])
        results["mm2"] = run_flow("MM2, dcmirror clusters", tmp_path, source, target, "broad", start_mm2,
                                  partitions, n, m)
    finally:
        source.stop()
        target.stop()
    (tmp_path / "kafka").mkdir()
    kafka_source = KafkaCluster(tmp_path / "kafka-source", 1, config=BENCH_BROKER_CONFIG).start()
    kafka_target = KafkaCluster(tmp_path / "kafka-target", 1, config=BENCH_BROKER_CONFIG).start()
    try:
        results["mm2_kafka"] = run_flow("MM2, Kafka clusters", tmp_path / "kafka", kafka_source, kafka_target,
                                        "broad", start_mm2, partitions, n, m)
    finally:
        kafka_source.stop()
        kafka_target.stop()
    dc, mm, mk = results["dc"], results["mm2"], results["mm2_kafka"]
    assert dc["after_restart"] == n + m, f"the dcmirror flow is exactly once: {dc['after_restart']:,} != {n + m:,}"
    head = f"  {'':<40} {'dcmirror worker':>16} {'MM2 ' + KAFKA_VERSION:>14} {'MM2, Kafka→Kafka':>17}"

    def row(label: str, key: str, fmt: str) -> str:
        return f"  {label:<40} {dc[key]:>16{fmt}} {mm[key]:>14{fmt}} {mk[key]:>17{fmt}}"

    emit("\n".join([
        f"=== a mirror flow of {partitions:,} partitions (topics of {TOPIC_PARTITIONS}, one worker / one MM2 task): "
        f"{n:,} records preloaded, {m:,} more across a kill -9 of the mirror; one round ===",
        head,
        row("start to every target topic created (s)", "topics_s", ".1f"),
        row("start to the first mirrored record (s)", "start_s", ".1f"),
        row("bulk rate (records/s)", "rate", ",.0f"),
        row(f"restart to all {n + m:,} mirrored (s)", "restart_s", ".1f"),
        row("records read from the target then", "after_restart", ",.0f"),
        f"ratio bulk dcmirror/MM2: {dc['rate'] / mm['rate']:.2f} (dcmirror clusters), "
        f"{dc['rate'] / mk['rate']:.2f} (Kafka clusters)",
    ]))


def start_dcmirror_topics(root: Path, source: Any, target: Any, topic: str) -> subprocess.Popen[Any]:
    """The dcmirror worker of a mirror-topics flow (same offsets) over the same topics."""
    path = topology(root, source, target, topic)
    path.write_text(path.read_text().replace('workers = 1', 'workers = 1\nmirror_topics = true'))
    return subprocess.Popen([sys.executable, "-m", "deploy.cli", "--log-level", "WARNING", "mirror", "--config",
                             str(path), "--flow", "bench", "--worker", "0"])


@pytest.mark.timeout(3600)
def test_mirror_topics_of_thousands_of_partitions(tmp_path: Path) -> None:
    """The same steps for a mirror-topics flow (each target partition at its source's offsets,
    byte for byte): dcmirror only, MirrorMaker 2 has no such mode. After the kill -9 and
    restart the target holds exactly the source's records (a mirror topic cannot hold a copy
    twice: the same offsets)."""
    from tests.perf.test_vs_kafka import BENCH_BROKER_CONFIG

    partitions = env_int("DCMIRROR_BENCH_MIRROR_PARTITIONS", 5_000)
    n = env_int("DCMIRROR_BENCH_MIRROR_RECORDS", 200_000)
    m = env_int("DCMIRROR_BENCH_MIRROR_RESTART_RECORDS", 50_000)
    source = ClusterProcesses(tmp_path / "source", 1, name="source", **BENCH_BROKER_CONFIG).start()
    target = ClusterProcesses(tmp_path / "target", 1, name="target", **BENCH_BROKER_CONFIG).start()
    try:
        got = run_flow("dcmirror mirror topics", tmp_path, source, target, "same", start_dcmirror_topics,
                       partitions, n, m)
    finally:
        source.stop()
        target.stop()
    assert got["after_restart"] == n + m, f"mirror topics hold each record once: {got['after_restart']:,}"
    emit("\n".join([
        f"=== a mirror-topics flow of {partitions:,} partitions (topics of {TOPIC_PARTITIONS}, one worker): "
        f"{n:,} records preloaded, {m:,} more across a kill -9 of the worker; one round ===",
        f"  start to every target topic created: {got['topics_s']:.1f} s",
        f"  start to the first mirrored record: {got['start_s']:.1f} s",
        f"  bulk rate: {got['rate']:,.0f} records/s",
        f"  restart to all {n + m:,} mirrored: {got['restart_s']:.1f} s ({got['after_restart']:,.0f} read)",
    ]))
