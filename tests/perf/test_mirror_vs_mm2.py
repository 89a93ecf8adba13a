"""dcmirror's mirror worker beside MirrorMaker 2 (Kafka 4.3.1's connect-mirror, dedicated
mode, one task), on the same two single-broker dcmirror clusters, one after the other.

Each phase for each mirror, on a topic of its own (6 partitions, 200-byte records):
  1. bulk: N records preloaded into the source, then the mirror starts; the rate is counted
     from the first mirrored record to the last (process start, group join and MM2's JVM and
     connector start are reported apart);
  2. paced: the source is written at a fixed rate for a while; a consumer on the target takes
     each record's lag (its arrival - its timestamp, which both mirrors keep): p50 and p99.
Knobs: DCMIRROR_BENCH_MM2_RECORDS (default 300,000), DCMIRROR_BENCH_MM2_PACED_S (10),
DCMIRROR_BENCH_MM2_RATE (records/s of the paced phase, default 5,000).
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


@pytest.mark.timeout(2 * 3600)
def test_mirror_worker_beside_mirrormaker2(tmp_path: Path) -> None:
    n = env_int("DCMIRROR_BENCH_MM2_RECORDS", 300_000)
    paced_s = env_int("DCMIRROR_BENCH_MM2_PACED_S", 10)
    rate = env_int("DCMIRROR_BENCH_MM2_RATE", 5000)
    values = payloads(RECORD_BYTES)
    source = ClusterProcesses(tmp_path / "source", 1, name="source").start()
    target = ClusterProcesses(tmp_path / "target", 1, name="target").start()
    results: dict[str, dict[str, float]] = {}
    try:
        for name, topic, target_topic, start in (("dcmirror worker", "events-dc", "source.events-dc", start_dcmirror),
                                                 (f"MirrorMaker 2 ({KAFKA_VERSION})", "events-mm2",
                                                  "source.events-mm2", start_mm2)):
            admin = AdminClient({"bootstrap.servers": source.bootstrap})
            admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=60)
            trio.run(_produce, source.bootstrap, topic, n, values)
            progress(f"{name}: {n:,} records preloaded")
            started = time.monotonic()
            proc = start(tmp_path, source, target, topic)
            try:
                figures = bulk(target, target_topic, n, started)
                progress(f"{name}: bulk {figures['rate']:,.0f} records/s")
                figures["p50"], figures["p99"] = paced_lag(source, topic, target, target_topic, rate, paced_s, values)
                results[name] = figures
            finally:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    finally:
        source.stop()
        target.stop()
    (dc, dcf), (mm, mmf) = results.items()
    emit("\n".join([
        f"=== mirror worker beside MirrorMaker 2: {n:,} x {RECORD_BYTES}-byte records, {PARTITIONS} partitions, "
        f"dcmirror clusters ===",
        f"  {'':<34} {dc:>18} {mm:>26} {'dcmirror/MM2':>13}",
        f"  {'bulk rate (records/s)':<34} {dcf['rate']:>18,.0f} {mmf['rate']:>26,.0f} {dcf['rate'] / mmf['rate']:>13.2f}",
        f"  {'start to first record (s)':<34} {dcf['start_s']:>18.1f} {mmf['start_s']:>26.1f}",
        f"  {f'lag p50 at {rate}/s (s)':<34} {dcf['p50']:>18.3f} {mmf['p50']:>26.3f} {dcf['p50'] / mmf['p50']:>13.2f}",
        f"  {f'lag p99 at {rate}/s (s)':<34} {dcf['p99']:>18.3f} {mmf['p99']:>26.3f} {dcf['p99'] / mmf['p99']:>13.2f}",
    ]))
