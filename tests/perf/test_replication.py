"""Cost of replication: a 3-broker cluster at acks=all against one standalone broker at acks=1.

Run with `make bench` (or `pytest -m perf -q -s tests/perf/test_replication.py`). Figures are
printed and written to tests/perf/results/latest.txt; nothing is asserted about speed, only
correctness (every record acknowledged without error, the high watermarks and a consumer
read-back account for exactly the records produced). Phases, one at a time (2-core machine):

  1. one standalone broker, topic 6 partitions RF 1, producer acks=1: msg/s, MB/s (baseline)
  2. a 3-broker topology cluster, topic 6 partitions RF 3 min.insync.replicas=2, producer
     acks=all with enable.idempotence=true: msg/s, MB/s, p50/p99 delivery latency at full rate;
     then every record read back by a consumer
  3. the same cluster, produce paced at 50% of the rate measured in 2: p50/p99/p99.9 latency
  4. redis-server (Redis Streams, redis-py XADD pipelines), the standing peer

Both full-rate phases use the same client settings apart from acks/idempotence: benchlib's
producer_conf (linger.ms=5, batch.size=1MiB, no compression) with librdkafka's default client
queue (100,000 messages), and the same loop. Latency = produce() call -> delivery callback,
sampled on every LATENCY_SAMPLE-th record at full rate (a Python callback per record would take
CPU from the two cores the brokers run on) and taken on every record when paced. At full rate
the producer is always ahead of the brokers, so that latency is mostly time in the client queue
(about queue depth / throughput); the produce request round trip librdkafka measures (its
statistics, 1 s windows) is printed next to it. Knobs:

  DCMIRROR_BENCH_REPL_RECORDS          records per full-rate phase (default 3,000,000)
  DCMIRROR_BENCH_REPL_LATENCY_SECONDS  duration of the paced phase (default 10)
  DCMIRROR_BENCH_REPL_REDIS            0 to skip the redis phase (default 1)
  DCMIRROR_BENCH_REPL_CLIENT_QUEUE     queue.buffering.max.messages at full rate (default 100,000)
  DCMIRROR_BENCH_REDIS_PIPELINE        XADDs per redis-py pipeline (default 2000)
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.cluster_helpers import create_topic as create_replicated_topic
from tests.cluster_helpers import log_tails, metadata, partitions_of, topic_ready, wait_until
from tests.harness import BrokerProcess, ClusterProcesses
from tests.perf.benchlib import (
    PARTITIONS,
    Latency,
    OtherLoad,
    Rate,
    RedisServer,
    consumer_conf,
    create_topic,
    emit,
    env_float,
    env_int,
    kafka_consume,
    kafka_paced_latency,
    measure,
    payloads,
    percentile,
    proc_cpu_seconds,
    producer_conf,
    progress,
    redis_produce,
    tail,
)

pytestmark = pytest.mark.perf

RATIO_TARGET = 0.40  # cluster acks=all msg/s / single broker acks=1 msg/s
P99_TARGET_MS = 10.0  # p99 produce latency at 50% of the full acks=all rate
PACED_FRACTION = 0.5
REPLICATION_FACTOR = 3
MIN_INSYNC = 2
LATENCY_SAMPLE = 8  # full-rate phases: every 8th record carries a delivery callback

# librdkafka's defaults (benchlib's producer_conf raises them to 2M messages / 2 GiB so its
# throughput loop never blocks; here a bounded queue keeps full-rate latency meaningful).
CLIENT_QUEUE: dict[str, object] = {
    "queue.buffering.max.messages": env_int("DCMIRROR_BENCH_REPL_CLIENT_QUEUE", 100_000),
    "queue.buffering.max.kbytes": 1_048_576,
}
ACKS_1 = {"acks": 1, "enable.idempotence": False}
ACKS_ALL = {"acks": "all", "enable.idempotence": True}


# --------------------------------------------------------------------------- producers


@dataclass
class FullRate:
    rate: Rate
    latencies_ms: list[float]  # sorted, sampled
    errors: list[str] = field(default_factory=list)
    rtt: str = ""

    def pct(self, q: float) -> float:
        return percentile(self.latencies_ms, q)


class RttStats:
    """stats_cb: per-broker produce round trip (rtt) of each statistics window, in ms."""

    def __init__(self) -> None:
        self.p50: list[float] = []
        self.p99: list[float] = []
        self.windows = 0

    def __call__(self, stats_json: str) -> None:
        self.windows += 1
        for b in json.loads(stats_json).get("brokers", {}).values():
            rtt = b.get("rtt") or {}
            if b.get("nodeid", -1) >= 0 and rtt.get("cnt", 0) > 0:
                self.p50.append(rtt["p50"] / 1000.0)
                self.p99.append(rtt["p99"] / 1000.0)

    def describe(self) -> str:
        if not self.p50:
            return "no librdkafka statistics window with requests"
        return (f"request round trip per broker and 1 s window (librdkafka stats, {len(self.p50)} "
                f"samples): p50 median {statistics.median(self.p50):.1f} ms, p99 median "
                f"{statistics.median(self.p99):.1f} ms, worst window p99 {max(self.p99):.1f} ms")


def produce_full_rate(bootstrap: str, topic: str, n: int, values: Sequence[bytes],
                      client: Mapping[str, object], progress_every_s: float = 10.0) -> FullRate:
    """Produce n records as fast as the client allows; the clock stops when flush() returns.

    One warm-up record (connections, metadata, producer id) is delivered before the clock
    starts. Records without a callback have no delivery report: their delivery is checked by
    the caller through the high watermarks (and the consumer read-back).
    """
    mask = len(values) - 1
    assert len(values) & mask == 0, "len(values) must be a power of two"
    errors: list[str] = []
    latencies: list[float] = []
    rtt = RttStats()
    perf = time.perf_counter

    def delivered(sent_at: float, err: object, msg: object) -> None:
        if err is None:
            latencies.append((perf() - sent_at) * 1000.0)
        else:
            errors.append(str(err))

    def client_error(err: object) -> None:
        errors.append(f"client error: {err}")

    conf = producer_conf(bootstrap, **CLIENT_QUEUE, **client)
    conf.update({"statistics.interval.ms": 1000, "stats_cb": rtt, "error_cb": client_error})
    p = Producer(conf)
    p.produce(topic, values[0], on_delivery=lambda err, msg: errors.append(f"warm-up: {err}") if err else None)
    if p.flush(30) != 0:
        raise RuntimeError(f"warm-up record to {topic} not delivered within 30s")
    if errors:
        raise RuntimeError(f"warm-up record to {topic} failed: {errors[0]}")
    rtt.p50.clear()
    rtt.p99.clear()
    produce, poll = p.produce, p.poll
    queue_full = 0
    next_report = perf() + progress_every_s
    start = perf()
    for i in range(n):
        while True:
            try:
                if i % LATENCY_SAMPLE:
                    produce(topic, values[i & mask])
                else:
                    produce(topic, values[i & mask], on_delivery=functools.partial(delivered, perf()))
                break
            except BufferError:
                queue_full += 1
                poll(0.005)
        if not i & 0x3FF:
            poll(0)  # often, so that sampled callbacks are timed when they arrive
            if progress_every_s and perf() > next_report:
                progress(f"produced {i:,}/{n:,} (in flight/queued {len(p):,})")
                next_report += progress_every_s
    enqueued = perf()
    remaining = p.flush(600)
    elapsed = perf() - start
    p.poll(0)
    if remaining:
        errors.append(f"{remaining:,} records still undelivered 600s after the last produce()")
    note = f"produce() loop {enqueued - start:.2f}s, flush {elapsed - (enqueued - start):.2f}s"
    if queue_full:
        note += f", client queue full {queue_full:,}x"
    latencies.sort()
    return FullRate(Rate(n, n * len(values[0]), elapsed, note=note), latencies, errors, rtt.describe())


def measured_full_rate(pids: dict[str, int | None], bootstrap: str, topic: str, n: int,
                       values: Sequence[bytes], client: Mapping[str, object]) -> FullRate:
    """produce_full_rate with benchlib.measure's CPU accounting attached to its Rate."""
    result: list[FullRate] = []

    def run() -> Rate:
        result.append(produce_full_rate(bootstrap, topic, n, values, client))
        return result[0].rate

    measure(pids, run)  # fills in result[0].rate.cpu
    return result[0]


def paced_latency(bootstrap: str, topic: str, rate: float, seconds: float, values: Sequence[bytes],
                  client: Mapping[str, object], system: str) -> Latency:
    """benchlib.kafka_paced_latency with the given acks/idempotence."""
    return kafka_paced_latency(bootstrap, topic, rate, seconds, values, system=system, flush_timeout_s=120.0,
                               **client)


# --------------------------------------------------------------------------- checks / helpers


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> list[int]:
    c = Consumer(consumer_conf(bootstrap))
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, i), timeout=10, cached=False)[1]
                for i in range(partitions)]
    finally:
        c.close()


def settle(pids: Sequence[int | None], idle_cores: float = 0.3, timeout_s: float = 20.0) -> float:
    """Wait until the processes together use under idle_cores (1 s windows): a new cluster
    creates __consumer_offsets and exchanges metadata for a while (idle, three brokers use
    about 0.2 cores). Returns the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        before = sum(proc_cpu_seconds(p) for p in pids)
        time.sleep(1.0)
        if sum(proc_cpu_seconds(p) for p in pids) - before < idle_cores:
            break
    return time.monotonic() - start


_LEVEL = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback")


def log_findings(name: str, text: str, limit: int = 6) -> list[str]:
    """WARNING/ERROR lines of a broker log, repeats collapsed (benchlib.tail)."""
    hits = [line for line in text.splitlines() if _LEVEL.search(line)]
    if not hits:
        return [f"{name}: no WARNING/ERROR lines"]
    return [f"{name}: {len(hits)} WARNING/ERROR line(s), last distinct:",
            *("    " + line for line in tail("\n".join(hits), limit).splitlines())]


def _ms(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"  # NaN -> "-"


def _row(label: str, rate: Rate | None, p50: float = float("nan"), p99: float = float("nan"),
         p999: float = float("nan"), failed: str = "FAILED") -> str:
    msgs = f"{rate.msg_s:,.0f}" if rate else failed
    mb = f"{rate.mb_s:.1f}" if rate else ""
    return f"{label:<56} {msgs:>10} {mb:>7} {_ms(p50):>8} {_ms(p99):>8} {_ms(p999):>9}"


# --------------------------------------------------------------------------- the benchmark


@pytest.mark.timeout(3600)
def test_replication_cost(tmp_path: Path) -> None:
    n = env_int("DCMIRROR_BENCH_REPL_RECORDS", 3_000_000)
    paced_seconds = env_float("DCMIRROR_BENCH_REPL_LATENCY_SECONDS", 10)
    use_redis = bool(env_int("DCMIRROR_BENCH_REPL_REDIS", 1)) and shutil.which("redis-server")
    pipeline_size = env_int("DCMIRROR_BENCH_REDIS_PIPELINE", 2000)
    values = payloads()
    expected = n + 1  # + the warm-up record
    failures: list[str] = []
    details: list[str] = []
    checks: list[tuple[str, bool]] = []  # correctness facts, asserted at the end

    print(f"\n=== replication: {n:,} x {len(values[0])}-byte records, {PARTITIONS} partitions ===",
          flush=True)

    # ---------------------------------------------------------------- 1. single broker, acks=1
    single: FullRate | None = None
    broker = BrokerProcess(tmp_path / "single")
    try:
        broker.start()
        assert broker.proc is not None
        topic = "bench-repl-single"
        partitions, note = create_topic(broker.bootstrap, topic, PARTITIONS)
        if note:
            details.append(f"single topic: {note}")
        progress(f"single broker on {broker.bootstrap}: producing {n:,} records, acks=1")
        single = measured_full_rate({"broker": broker.proc.pid}, broker.bootstrap, topic, n, values, ACKS_1)
        progress(f"single acks=1: {single.rate.describe()}")
        hw = high_watermarks(broker.bootstrap, topic, partitions)
        checks.append((f"single: no delivery errors ({len(single.errors)}: {single.errors[:2]})",
                       not single.errors))
        checks.append((f"single: high watermarks sum {sum(hw):,} == {expected:,} produced", sum(hw) == expected))
    except Exception as exc:  # noqa: BLE001 - still run the cluster, then fail with details
        failures.append(f"single broker: {exc!r}\n--- broker log tail ---\n{tail(broker.log_text(), 40)}")
    finally:
        try:
            broker.stop()
        except Exception as exc:  # noqa: BLE001
            failures.append(f"single broker did not stop on SIGTERM: {exc!r}")
        details.extend(log_findings("single broker log", broker.log_text()))
        shutil.rmtree(broker.data_dir, ignore_errors=True)

    # ---------------------------------------------------------------- 2./3. cluster, acks=all
    repl: FullRate | None = None
    readback: Rate | None = None
    paced_res: Latency | None = None
    paced_rate = 0.0
    cluster = ClusterProcesses(tmp_path / "cluster", 3, name="bench", min_insync_replicas=MIN_INSYNC)
    try:
        cluster.start()
        pids = {f"node {i}": b.proc.pid if b.proc else None for i, b in cluster.brokers.items()}
        waited = settle(list(pids.values()))
        details.append(f"cluster idle {waited:.1f}s after start before the first phase")
        topic = "bench-repl-cluster"
        topic_conf = {"min.insync.replicas": str(MIN_INSYNC)}
        create_replicated_topic(cluster.bootstrap, topic, PARTITIONS, REPLICATION_FACTOR, config=topic_conf)
        wait_until(lambda: topic_ready(cluster, topic, PARTITIONS, REPLICATION_FACTOR), 60,
                   f"{topic} with full ISRs", cluster)
        progress(f"cluster on {cluster.bootstrap}: producing {n:,} records, acks=all idempotent")
        repl = measured_full_rate(pids, cluster.bootstrap, topic, n, values, ACKS_ALL)
        progress(f"cluster acks=all: {repl.rate.describe()}")
        checks.append((f"cluster: no delivery errors ({len(repl.errors)}: {repl.errors[:2]})", not repl.errors))
        parts = partitions_of(metadata(cluster.bootstrap, topic), topic)
        shrunk = {i: p.isr for i, p in parts.items() if set(p.isr) != set(p.replicas)}
        details.append("ISRs after the full-rate phase: " +
                       (f"shrunk {shrunk}" if shrunk else f"all {len(parts)} partitions full"))
        hw = high_watermarks(cluster.bootstrap, topic, PARTITIONS)
        checks.append((f"cluster: high watermarks sum {sum(hw):,} == {expected:,} produced", sum(hw) == expected))
        progress(f"cluster: reading back {expected:,} records")
        readback = measure(pids, kafka_consume, cluster.bootstrap, topic, PARTITIONS, expected)
        progress(f"cluster read-back: {readback.describe()}")
        checks.append((f"cluster: consumer read back {readback.records:,} == {expected:,} produced",
                       readback.records == expected))

        paced_rate = round(PACED_FRACTION * repl.rate.msg_s)
        paced_topic = "bench-repl-paced"
        create_replicated_topic(cluster.bootstrap, paced_topic, PARTITIONS, REPLICATION_FACTOR, config=topic_conf)
        wait_until(lambda: topic_ready(cluster, paced_topic, PARTITIONS, REPLICATION_FACTOR), 60,
                   f"{paced_topic} with full ISRs", cluster)
        settle(list(pids.values()))
        progress(f"cluster: paced acks=all at {paced_rate:,} msg/s for {paced_seconds:g}s")
        with OtherLoad(*pids.values()) as load:
            paced_res = paced_latency(cluster.bootstrap, paced_topic, paced_rate, paced_seconds, values,
                                      ACKS_ALL, "cluster RF 3, acks=all, idempotent")
        paced_res.note = "; ".join(x for x in (paced_res.note, load.describe()) if x)
        progress(paced_res.row())
        checks.append((f"cluster paced: {paced_res.acked:,} of {paced_res.sent:,} acknowledged, "
                       f"{paced_res.errors} errors", paced_res.errors == 0 and paced_res.acked == paced_res.sent))
    except Exception as exc:  # noqa: BLE001 - still run redis, then fail with details
        failures.append(f"cluster: {exc!r}\n--- broker log tails ---\n{log_tails(cluster)}")
    finally:
        cluster.stop()
        for i, b in cluster.brokers.items():
            details.extend(log_findings(f"cluster node {i} log", b.log_text()))
            shutil.rmtree(b.data_dir, ignore_errors=True)
        details.append(f"cluster logs kept in {cluster.root / 'data' / 'bench'}")

    # ---------------------------------------------------------------- 4. redis, the peer
    r_prod: Rate | None = None
    if use_redis:
        server = RedisServer(tmp_path / "redis")
        try:
            server.start()
            r = server.client()
            try:
                progress(f"redis on 127.0.0.1:{server.port}: XADDing {n:,} entries")
                r_prod = measure({"redis": server.pid}, redis_produce, r, b"bench-repl", n, values, pipeline_size)
                progress(f"redis produce: {r_prod.describe()}")
            finally:
                r.close()
        except Exception as exc:  # noqa: BLE001 - reported with the redis log
            failures.append(f"redis: {exc!r}\n--- redis log tail ---\n{tail(server.log_text(), 20)}")
        finally:
            server.stop()
            shutil.rmtree(tmp_path / "redis", ignore_errors=True)

    # ---------------------------------------------------------------- report
    lines = [f"REPLICATION  {n:,} records x {len(values[0])} B, topics {PARTITIONS} partitions; librdkafka "
             f"linger.ms=5 batch.size=1MiB, client queue {CLIENT_QUEUE['queue.buffering.max.messages']:,} msgs; "
             f"full-rate latency sampled 1/{LATENCY_SAMPLE}",
             f"{'phase':<56} {'msg/s':>10} {'MB/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9}",
             _row("1 broker, RF 1, acks=1 (baseline)", single.rate if single else None,
                  *((single.pct(50), single.pct(99), single.pct(99.9)) if single else ())),
             _row(f"3 brokers, RF 3, min.isr {MIN_INSYNC}, acks=all idempotent", repl.rate if repl else None,
                  *((repl.pct(50), repl.pct(99), repl.pct(99.9)) if repl else ()))]
    if paced_res is not None:
        lat = sorted(paced_res.latencies_ms)
        achieved = Rate(paced_res.sent, paced_res.sent * len(values[0]), paced_res.send_seconds)
        lines.append(_row(f"  same, paced at {PACED_FRACTION:.0%} ({paced_rate:,} msg/s, {paced_seconds:g}s)",
                          achieved, percentile(lat, 50), percentile(lat, 99), percentile(lat, 99.9)))
    else:
        lines.append(_row(f"  same, paced at {PACED_FRACTION:.0%}", None))
    if use_redis:
        lines.append(_row(f"redis Streams (redis-py XADD pipeline {pipeline_size}, AOF everysec)", r_prod))
    if readback is not None:
        lines.append(_row("3 brokers: consumer read-back (confluent_kafka)", readback))

    ratio = repl.rate.msg_s / single.rate.msg_s if repl and single and single.rate.msg_s else None
    p99 = percentile(sorted(paced_res.latencies_ms), 99) if paced_res and paced_res.latencies_ms else None
    lines.append("ratio cluster acks=all / single broker acks=1 msg/s: " +
                 (f"{ratio:.2f}x -> {'MET' if ratio >= RATIO_TARGET else 'NOT MET'} (target >= {RATIO_TARGET:g}x)"
                  if ratio is not None else "n/a (missing figure)"))
    lines.append(f"p99 at {PACED_FRACTION:.0%} of the full acks=all rate: " +
                 (f"{p99:.2f} ms -> {'MET' if p99 <= P99_TARGET_MS else 'NOT MET'} (target <= {P99_TARGET_MS:g} ms)"
                  if p99 is not None else "n/a (missing figure)"))
    if repl and r_prod and r_prod.msg_s:
        lines.append(f"ratio cluster acks=all / redis XADD msg/s: {repl.rate.msg_s / r_prod.msg_s:.2f}x"
                     + (f"; single broker acks=1 / redis: {single.rate.msg_s / r_prod.msg_s:.2f}x" if single else ""))
    lines.append("")
    if single:
        lines.append(f"single acks=1:    {single.rate.describe()}")
        lines.append(f"  {single.rtt}")
    if repl:
        lines.append(f"cluster acks=all: {repl.rate.describe()}")
        lines.append(f"  {repl.rtt}")
    if readback:
        lines.append(f"cluster read-back: {readback.describe()}")
    if paced_res:
        lines.append(Latency.header())
        lines.append(paced_res.row())
        if paced_res.note:
            lines.append(f"  {paced_res.note}")
    if r_prod:
        lines.append(f"redis produce:    {r_prod.describe()}")
    lines.extend(details)
    lines.append("correctness:")
    lines.extend(f"  [{'ok' if ok else 'FAILED'}] {what}" for what, ok in checks)
    if failures:
        lines += ["", "FAILURES:", *failures]
    emit("\n".join(lines))
    if failures:
        pytest.fail("replication benchmark could not complete:\n" + "\n\n".join(failures), pytrace=False)
    bad = [what for what, ok in checks if not ok]
    assert not bad, "correctness: " + "; ".join(bad)
