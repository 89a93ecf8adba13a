"""One mirror worker's throughput and end-to-end lag (issue 7's benchmark).

Two single-broker clusters, source and target, one flow, one worker process
(`dcmirror mirror --flow F --worker 0`). Phases:

1. the dcmirror producer's own rate into the target cluster (the yardstick);
2. bulk: N records (200 B, 6 partitions) preloaded into the source, then the worker starts;
   rate = N / time until the target holds them all (claims included);
3. paced: the source is written at 50% of the bulk rate for a while; a consumer on the
   target measures each record's lag (arrival − the record's timestamp, which the mirror
   keeps) → p50 / p99.

Targets from the issue: one worker ≥ 50% of the producer's own rate; lag p99 ≤ 1 s.
Knobs: DCMIRROR_BENCH_MIRROR_RECORDS (default 300,000), DCMIRROR_BENCH_MIRROR_PACED_S (10).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import TopicPartition

from tests.harness import ClusterProcesses
from tests.perf.benchlib import (
    PARTITIONS,
    RECORD_BYTES,
    emit,
    env_int,
    payloads,
    percentile,
    progress,
)
from tests.perf.test_client import ours_produce

pytestmark = pytest.mark.perf
MB = 1_000_000


def _topology(root: Path, source: ClusterProcesses, target: ClusterProcesses) -> Path:
    lines = []
    for name, c in (("source", source), ("target", target)):
        lines += [f"[clusters.{name}]", f'datacenter = "{name}"',
                  "brokers = [" + ", ".join(f'"{a}"' for a in c.bootstrap.split(",")) + "]",
                  f'data_dir = "{root / name / "data" / name}"', ""]
    lines += ["[defaults]", "replication_factor = 1", "",
              "[[mirrors]]", 'name = "bench"', 'source = "source"', 'target = "target"', 'topics = "events"',
              "workers = 1", 'config = { "topic.refresh.ms" = "1000" }', ""]
    path = root / "topology.toml"
    path.write_text("\n".join(lines))
    return path


def _target_total(bootstrap: str, topic: str) -> int:
    c = CkConsumer({"bootstrap.servers": bootstrap, "group.id": "bench-watch"})
    try:
        total = 0
        for p in range(PARTITIONS):
            try:
                total += c.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
            except Exception:  # noqa: BLE001 - topic not there yet
                return 0
        return total
    finally:
        c.close()


async def _produce(bootstrap: str, topic: str, n: int, values: list[bytes], rate: float | None = None) -> None:
    from cluster.client.accumulator import BufferFull
    from cluster.client.producer import Producer

    async with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as p:
        start = trio.current_time()
        for i in range(n):
            if rate is not None and i % 100 == 0:
                due = start + i / rate
                now = trio.current_time()
                if due > now:
                    await trio.sleep(due - now)
            try:
                p.produce(topic, values[i & (len(values) - 1)])
            except BufferFull:
                await (await p.send(topic, values[i & (len(values) - 1)])).wait()
            if i % 1024 == 0:
                await trio.lowlevel.checkpoint()
        await p.flush()


def test_one_worker_throughput_and_lag(tmp_path: Path) -> None:
    n = env_int("DCMIRROR_BENCH_MIRROR_RECORDS", 300_000)
    paced_s = env_int("DCMIRROR_BENCH_MIRROR_PACED_S", 10)
    values = payloads(RECORD_BYTES)
    source = ClusterProcesses(tmp_path / "source", 1, name="source")
    target = ClusterProcesses(tmp_path / "target", 1, name="target")
    source.start()
    target.start()
    worker = None
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        for c, topic in ((source, "events"), (target, "yardstick")):
            admin = AdminClient({"bootstrap.servers": c.bootstrap})
            for f in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
                f.result()
        yard = ours_produce(target.bootstrap, "yardstick", n, values)
        progress(f"producer yardstick: {yard.describe()}")
        trio.run(_produce, source.bootstrap, "events", n, values)
        topology = _topology(tmp_path, source, target)
        started = time.monotonic()
        worker = subprocess.Popen([sys.executable, "-m", "deploy.cli", "--log-level", "WARNING", "mirror",
                                   "--config", str(topology), "--flow", "bench", "--worker", "0"])
        # Fence records (one per partition) come on top of the n mirrored records. The rate is
        # measured from the first mirrored record on: process start, group join (the broker's
        # group.initial.rebalance.delay.ms) and claims are reported apart.
        first_at = first_count = None
        while True:
            total = _target_total(target.bootstrap, "source.events")
            now = time.monotonic()
            if first_at is None and total > PARTITIONS:
                first_at, first_count = now, total
            if total >= n:
                break
            assert worker.poll() is None, "the worker died"
            assert now - started < 600, "mirror too slow"
            time.sleep(0.02)
        assert first_at is not None and first_count is not None
        startup_s = first_at - started
        bulk_s = now - first_at
        bulk_rate = (total - first_count) / bulk_s
        progress(f"mirror bulk: {n:,} records, first after {startup_s:.2f} s, then {bulk_rate:,.0f} msg/s")

        # Paced at 50%: lag of every record, measured by a consumer on the target.
        rate = bulk_rate / 2
        paced_n = int(rate * paced_s)
        consumer = CkConsumer({"bootstrap.servers": target.bootstrap, "group.id": "bench-lag",
                               "enable.auto.commit": False, "fetch.wait.max.ms": 10})
        ends = {p: consumer.get_watermark_offsets(TopicPartition("source.events", p))[1] for p in range(PARTITIONS)}
        consumer.assign([TopicPartition("source.events", p, ends[p]) for p in range(PARTITIONS)])
        lags_s: list[float] = []

        import threading

        producer_thread = threading.Thread(target=trio.run, args=(_produce, source.bootstrap, "events", paced_n,
                                                                  values, rate))
        producer_thread.start()
        deadline = time.monotonic() + paced_s + 60
        while len(lags_s) < paced_n and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.2):
                if m.error() is None and m.value() is not None:
                    lags_s.append(time.time() - m.timestamp()[1] / 1000)
        producer_thread.join()
        consumer.close()
        lags_s.sort()
        p50, p99 = percentile(lags_s, 50), percentile(lags_s, 99)
        ratio = bulk_rate / yard.msg_s
        lines = [
            f"MIRROR  one worker, source and target one broker each, {PARTITIONS} partitions, {RECORD_BYTES} B records",
            f"producer's own rate (yardstick)   {yard.msg_s:>12,.0f} msg/s {yard.msg_s * RECORD_BYTES / MB:7.1f} MB/s",
            f"one mirror worker (bulk {n:,})   {bulk_rate:>12,.0f} msg/s {bulk_rate * RECORD_BYTES / MB:7.1f} MB/s"
            f"  (first record {startup_s:.1f} s after the worker started: startup, group join, claims)",
            f"worker / producer: {ratio:.2f}x -> {'MET' if ratio >= 0.5 else 'NOT MET'} (target >= 0.5x)",
            f"end-to-end lag at 50% ({rate:,.0f} msg/s for {paced_s} s, {len(lags_s):,} records): "
            f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms -> {'MET' if p99 <= 1.0 else 'NOT MET'} (target p99 <= 1 s)",
        ]
        emit("\n".join(lines))
        assert len(lags_s) == paced_n, f"only {len(lags_s)} of {paced_n} paced records arrived"
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(30)
        source.stop()
        target.stop()
