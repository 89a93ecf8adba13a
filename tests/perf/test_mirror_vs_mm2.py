"""dcmirror's mirror worker beside MirrorMaker 2 (Kafka 4.3.1's connect-mirror, dedicated
mode, one task), on the same two single-broker dcmirror clusters, one after the other; then
MM2 between two single-broker Kafka clusters, as its users run it.

Each phase for each mirror, on a topic of its own (6 partitions, 200-byte records):
  1. bulk: N records preloaded into the source, then the mirror starts; the rate is counted
     from the first mirrored record to the last (process start, group join and MM2's JVM and
     connector start are reported apart);
  2. paced: the source is written at a fixed rate for a while; a consumer on the target takes
     each record's lag (its arrival - its timestamp, which both mirrors keep): p50 and p99.
Knobs: DCMIRROR_BENCH_MM2_RECORDS (default 300,000), DCMIRROR_BENCH_MM2_PACED_S (10),
DCMIRROR_BENCH_MM2_RATE (records/s of the paced phase, default 5,000), DCMIRROR_BENCH_MM2_ROUNDS
(default 3: the two mirrors between dcmirror clusters alternated round by round, then MM2
between Kafka clusters as many times; medians, and the range of the per-round ratios).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import OFFSET_END, TopicPartition
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.harness import ClusterProcesses
from tests.peers.fetch import classpath
from tests.peers.kafka import KAFKA_VERSION, TOOL_JVM, java
from tests.perf.benchlib import (
    PARTITIONS,
    RECORD_BYTES,
    emit,
    env_int,
    payloads,
    percentile,
    progress,
)
from tests.perf.test_mirror import _produce, _target_total

pytestmark = pytest.mark.perf
MM2_MAIN = "org.apache.kafka.connect.mirror.MirrorMaker"
LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
"""


def mm2_props(source: str, target: str, topic: str) -> str:
    lines = {
        "clusters": "source, target", "source.bootstrap.servers": source, "target.bootstrap.servers": target,
        "source->target.enabled": "true", "source->target.topics": topic, "target->source.enabled": "false",
        "plugin.discovery": "service_load", "source.plugin.discovery": "service_load",
        "target.plugin.discovery": "service_load",
        "replication.factor": "1", "checkpoints.topic.replication.factor": "1",
        "heartbeats.topic.replication.factor": "1", "offset-syncs.topic.replication.factor": "1",
        "offset.storage.replication.factor": "1", "status.storage.replication.factor": "1",
        "config.storage.replication.factor": "1", "tasks.max": "1",
        "refresh.topics.interval.seconds": "2", "emit.checkpoints.enabled": "false",
        "sync.group.offsets.enabled": "false",
        # Its producer as a user would tune it for throughput: batches and a little linger.
        "target.producer.linger.ms": "5", "target.producer.batch.size": "1048576",
    }
    return "".join(f"{k} = {v}\n" for k, v in lines.items())


def topology(root: Path, source: ClusterProcesses, target: ClusterProcesses, topic: str) -> Path:
    lines = []
    for name, c in (("source", source), ("target", target)):
        lines += [f"[clusters.{name}]", f'datacenter = "{name}"', f'brokers = ["{c.bootstrap}"]',
                  f'data_dir = "{root / name / "data" / name}"', ""]
    lines += ["[defaults]", "replication_factor = 1", "", "[[mirrors]]", 'name = "bench"', 'source = "source"',
              'target = "target"', f'topics = "{topic}"', "workers = 1", 'config = { "topic.refresh.ms" = "1000" }']
    path = root / f"topology-{topic}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def start_dcmirror(root: Path, source: ClusterProcesses, target: ClusterProcesses, topic: str) -> subprocess.Popen[Any]:
    return subprocess.Popen([sys.executable, "-m", "deploy.cli", "--log-level", "WARNING", "mirror", "--config",
                             str(topology(root, source, target, topic)), "--flow", "bench", "--worker", "0"])


def start_mm2(root: Path, source: ClusterProcesses, target: ClusterProcesses, topic: str) -> subprocess.Popen[Any]:
    work = root / "mm2"
    work.mkdir(exist_ok=True)
    (work / "mm2.properties").write_text(mm2_props(source.bootstrap, target.bootstrap, topic))
    (work / "log4j2.properties").write_text(LOG4J2.format(path=work / "mm2.log"))
    jvm = tuple(o for o in TOOL_JVM if not o.startswith(("-Xmx", "-XX:TieredStopAtLevel"))) + ("-Xmx1g",)
    return subprocess.Popen([java(), *jvm, f"-Dlog4j2.configurationFile={work / 'log4j2.properties'}",
                             "-cp", classpath("kafka"), MM2_MAIN, str(work / "mm2.properties")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work)


def bulk(target: ClusterProcesses, target_topic: str, n: int, started: float) -> dict[str, float]:
    first_at = first_count = None
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        total = _target_total(target.bootstrap, target_topic)
        now = time.monotonic()
        if total and first_at is None:
            first_at, first_count = now, total
        if total >= n:
            assert first_at is not None and first_count is not None
            return {"start_s": first_at - started, "rate": (n - first_count) / max(now - first_at, 1e-9)}
        time.sleep(0.1)
    raise TimeoutError(f"{target_topic}: not all {n} records mirrored in 900 s")


def paced_lag(source: ClusterProcesses, topic: str, target: ClusterProcesses, target_topic: str, rate: float,
              seconds: float, values: list[bytes]) -> tuple[float, float]:
    c = CkConsumer({"bootstrap.servers": target.bootstrap, "group.id": f"lag-{target_topic}",
                    "fetch.wait.max.ms": 10, "log_level": 2})
    c.assign([TopicPartition(target_topic, p, OFFSET_END) for p in range(PARTITIONS)])
    c.consume(1, timeout=1.0)
    n = int(rate * seconds)
    lags: list[float] = []

    writer = threading.Thread(target=lambda: trio.run(_produce, source.bootstrap, topic, n, values, rate))
    writer.start()
    deadline = time.monotonic() + seconds + 120
    while len(lags) < n and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=0.5):
            if m.error() is None:
                lags.append(time.time() - m.timestamp()[1] / 1000)
    writer.join()
    c.close()
    lags.sort()
    return percentile(lags, 50), percentile(lags, 99)


def run_mirror(name: str, root: Path, source: Any, target: Any, topic: str, start: Any, n: int, rate: int,
               paced_s: int, values: list[bytes]) -> dict[str, float]:
    """One mirror on its own topic: the bulk phase, then the paced one."""
    admin = AdminClient({"bootstrap.servers": source.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=60)
    trio.run(_produce, source.bootstrap, topic, n, values)
    progress(f"{name}: {n:,} records preloaded")
    started = time.monotonic()
    proc = start(root, source, target, topic)
    try:
        figures = bulk(target, f"source.{topic}", n, started)
        progress(f"{name}: bulk {figures['rate']:,.0f} records/s")
        figures["p50"], figures["p99"] = paced_lag(source, topic, target, f"source.{topic}", rate, paced_s, values)
        return figures
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL after 60 s."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.mark.timeout(2 * 3600)
def test_mirror_worker_beside_mirrormaker2(tmp_path: Path) -> None:
    """The dcmirror worker and MM2 between the same two dcmirror clusters, then MM2 between two
    Kafka 4.3.1 clusters (what MM2's users run; its own brokers, the same settings as
    test_vs_kafka's BENCH_BROKER_CONFIG on both sides)."""
    from tests.peers.kafka import KafkaCluster
    from tests.perf.test_vs_kafka import BENCH_BROKER_CONFIG

    n = env_int("DCMIRROR_BENCH_MM2_RECORDS", 300_000)
    paced_s = env_int("DCMIRROR_BENCH_MM2_PACED_S", 10)
    rate = env_int("DCMIRROR_BENCH_MM2_RATE", 5000)
    rounds = max(1, env_int("DCMIRROR_BENCH_MM2_ROUNDS", 3))
    values = payloads(RECORD_BYTES)
    results: dict[str, list[dict[str, float]]] = {"dc": [], "mm2": [], "mm2_kafka": []}
    source = ClusterProcesses(tmp_path / "source", 1, name="source", **BENCH_BROKER_CONFIG).start()
    target = ClusterProcesses(tmp_path / "target", 1, name="target", **BENCH_BROKER_CONFIG).start()
    try:
        for r in range(rounds):  # alternated: dcmirror first in even rounds, MM2 first in odd ones
            runs = [("dc", "dcmirror worker", start_dcmirror), ("mm2", "MM2, dcmirror clusters", start_mm2)]
            for key, name, start in runs if r % 2 == 0 else runs[::-1]:
                results[key].append(run_mirror(f"{name}, round {r + 1}/{rounds}", tmp_path, source, target,
                                               f"events-{key}-{r}", start, n, rate, paced_s, values))
    finally:
        source.stop()
        target.stop()
    (tmp_path / "kafka").mkdir()
    kafka_source = KafkaCluster(tmp_path / "kafka-source", 1, config=BENCH_BROKER_CONFIG).start()
    kafka_target = KafkaCluster(tmp_path / "kafka-target", 1, config=BENCH_BROKER_CONFIG).start()
    try:
        for r in range(rounds):
            results["mm2_kafka"].append(run_mirror(f"MM2, Kafka clusters, round {r + 1}/{rounds}", tmp_path / "kafka",
                                                   kafka_source, kafka_target, f"events-mm2k-{r}", start_mm2, n,
                                                   rate, paced_s, values))
    finally:
        kafka_source.stop()
        kafka_target.stop()

    def median(key: str, figure: str) -> float:
        got = sorted(run[figure] for run in results[key])
        return got[len(got) // 2]

    def ratios(figure: str, other: str) -> str:
        per = sorted(a[figure] / b[figure] for a, b in zip(results["dc"], results[other], strict=True))
        middle = per[len(per) // 2]
        return f"{middle:.2f} ({per[0]:.2f}-{per[-1]:.2f})" if len(per) > 1 else f"{middle:.2f}"

    head = (f"  {'':<30} {'dcmirror worker':>16} {'MM2 ' + KAFKA_VERSION:>14} {'MM2, Kafka→Kafka':>17} "
            f"{'dc/MM2 (range)':>18} {'dc/MM2 Kafka (range)':>22}")

    def row(label: str, figure: str, fmt: str, with_ratio: bool = True) -> str:
        cells = "".join(f" {median(k, figure):>{w}{fmt}}" for k, w in (("dc", 16), ("mm2", 14), ("mm2_kafka", 17)))
        tail = f" {ratios(figure, 'mm2'):>18} {ratios(figure, 'mm2_kafka'):>22}" if with_ratio else ""
        return f"  {label:<30}{cells}{tail}"

    emit("\n".join([
        f"=== mirror worker beside MirrorMaker 2: {n:,} x {RECORD_BYTES}-byte records, {PARTITIONS} partitions; "
        f"dcmirror and MM2 between the same two dcmirror clusters (alternated), and MM2 between two Kafka "
        f"{KAFKA_VERSION} clusters; medians of {rounds} round(s), ratios per round ===",
        head,
        row("bulk rate (records/s)", "rate", ",.0f"),
        row("start to first record (s)", "start_s", ".1f", with_ratio=False),
        row(f"lag p50 at {rate}/s (s)", "p50", ".3f"),
        row(f"lag p99 at {rate}/s (s)", "p99", ".3f"),
        "bulk: from the first mirrored record to the last; the process / JVM and connector start is the start row",
    ]))
