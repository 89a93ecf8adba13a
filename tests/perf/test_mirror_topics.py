"""Mirror topics (issue 31's benchmark): one worker of a flow with `mirror_topics = true`,
which copies whole batches at their offsets (MirrorAppend), beside one worker of today's
record-rewriting flow, on single-broker source and target clusters, 200-byte records in
6 partitions written by librdkafka.

1. loopback throughput: N records preloaded (DCMIRROR_BENCH_MT_RECORDS, default 2,000,000);
   the record flow's worker, then the mirror-topics worker, each counted from its first
   record in the target to its last (startup, group join and claims reported apart).
   Goal: mirror topics >= 3x the record flow.
2. keeping up: one librdkafka producer writes as fast as it can for DCMIRROR_BENCH_MT_KEEPUP_S
   (20) while the mirror-topics worker copies; the producer's rate, the worker's, the lag
   (source end - target end, sampled every 100 ms) and how long the copy needed after the
   producer's last acknowledgement. Kept up: the last quarter's worst lag is at most 2 s of
   production and the copy is complete within 2 s of the producer's end.
3. WAN: the source also listens behind a delaying TCP proxy (tests/perf/delay_proxy.py; this
   kernel has no netem) that adds DCMIRROR_BENCH_MT_WAN_DELAY_MS (50) each way, 100 ms round
   trips, and advertises the proxy, so every connection of the worker to the source crosses
   it. The librdkafka consumer alone directly, through a 0 ms proxy (what the proxy costs)
   and through the 50 ms one; then the mirror-topics worker over loopback, through the 0 ms
   proxy (bulk only) and over the WAN: bulk rate (DCMIRROR_BENCH_MT_WAN_RECORDS, 2,000,000)
   and lag p50/p99 of records written at DCMIRROR_BENCH_MT_PACED_RATE (20,000/s) for DCMIRROR_BENCH_MT_PACED_S (10 s), measured
   by a consumer of the mirror topic (arrival - the record's timestamp, which is copied).
   Goal: WAN >= 0.8x loopback. DCMIRROR_BENCH_MT_WAN_CONSUMER ("k=v,k=v") adds consumer
   settings to the workers behind the proxies (fetch.max.bytes, max.partition.fetch.bytes, ...);
   DCMIRROR_BENCH_MT_SOURCE_FETCH_MAX_BYTES sets the source broker's fetch.max.bytes (the
   cap on one fetch answer, 57,671,680 by default as in Kafka). DCMIRROR_BENCH_MT_FETCHERS
   sets the flows' num.replica.fetchers (fetch connections per source broker) in every run
   of this benchmark, loopback included (default: the flow's default).

Figures are printed and added to tests/perf/results/latest.txt; nothing asserts speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka import Producer as CkProducer
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.harness import ClusterProcesses
from tests.perf.benchlib import (
    PARTITIONS,
    RECORD_BYTES,
    create_topic,
    emit,
    env_int,
    free_port,
    kafka_consume,
    kafka_produce,
    payloads,
    percentile,
    proc_cpu_seconds,
    producer_conf,
    progress,
    tail,
)

pytestmark = pytest.mark.perf
MB = 1_000_000
TOPIC = "events"
STARTUP_TIMEOUT_S = 90.0
# One librdkafka producer writing 200-byte records as fast as it can for argv[2] seconds
# (the benchmarks' produce loop, benchlib.kafka_produce); prints when it started and when the
# last record was acknowledged (time.monotonic(): one clock for every process).
FLOOD = r"""
import json, os, sys, time
from confluent_kafka import Producer
topic, seconds, conf = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
values = [os.urandom(200) for _ in range(1024)]
failed = [0]
def delivered(err, msg):
    if err is not None:
        failed[0] += 1
p = Producer({**conf, "on_delivery": delivered})
produce, poll = p.produce, p.poll
sent = 0
start = time.monotonic()
until = start + seconds
while time.monotonic() < until:
    for _ in range(4096):
        try:
            produce(topic, values[sent & 1023])
            sent += 1
        except BufferError:
            poll(0.005)
    poll(0)
undelivered = p.flush(120)
print(json.dumps({"start": start, "acked": time.monotonic(), "sent": sent, "failed": failed[0],
                  "undelivered": undelivered}))
"""


# --------------------------------------------------------------------------- clusters, flows


def _cluster_lines(name: str, brokers: list[str]) -> list[str]:
    return [f"[clusters.{name}]", f'datacenter = "{name}"',
            "brokers = [" + ", ".join(f'"{b}"' for b in brokers) + "]", f'data_dir = "/nonexistent/{name}"', ""]


def _flow_topology(root: Path, name: str, source: tuple[str, list[str]], target: tuple[str, list[str]], *,
                   mirror_topics: bool, rename: str | None = None, consumer: dict[str, str] | None = None) -> Path:
    """A topology with one flow `name` from `source` into `target` ((cluster name, brokers));
    the cluster names give the flow its source group (dcmirror.<source>.<target>), so each
    flow of a benchmark names its clusters apart."""
    config = {"topic.refresh.ms": "1000", **{f"consumer.{k}": v for k, v in (consumer or {}).items()}}
    if fetchers := os.environ.get("DCMIRROR_BENCH_MT_FETCHERS"):
        config["num.replica.fetchers"] = fetchers
    lines = [*_cluster_lines(*source), *_cluster_lines(*target),
             "[defaults]", "replication_factor = 1", "",
             "[[mirrors]]", f'name = "{name}"', f'source = "{source[0]}"', f'target = "{target[0]}"',
             f'topics = "{TOPIC}"', "workers = 1",
             "config = { " + ", ".join(f'"{k}" = "{v}"' for k, v in config.items()) + " }"]
    if mirror_topics:
        lines.append("mirror_topics = true")
    if rename is not None:
        lines.append(f'rename = "{rename}"')
    path = root / f"topology-{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def _worker(topology: Path, flow: str) -> Iterator[subprocess.Popen[bytes]]:
    log_path = topology.with_name(f"worker-{flow}.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "--log-level", "INFO", "mirror",
                                 "--config", str(topology), "--flow", flow, "--worker", "0"],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    except BaseException:
        progress(f"worker {flow}'s log ({log_path}), its end:\n" + tail(log_path.read_text(errors="replace"), 40))
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Ends:
    """Sum of a topic's partition end offsets: one ListOffsets (AdminClient) per call. The
    client is made again while the topic is missing (librdkafka remembers a missing topic)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap})

    def total(self, topic: str) -> int:
        futures = self.admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)},
                                          request_timeout=10)
        try:
            return sum(f.result().offset for f in futures.values())
        except KafkaException:  # the topic is not there yet
            self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
            return 0

    def close(self) -> None:
        pass


def _pid(cluster: ClusterProcesses) -> int | None:
    proc = cluster[1].proc
    return proc.pid if proc is not None else None


def _bulk(worker: subprocess.Popen[bytes], ends: _Ends, topic: str, n: int,
          others: dict[str, int | None]) -> tuple[float, float, dict[str, float]]:
    """Wait until `topic` holds n records; returns (seconds to the first record, records/s from
    the first to the n-th, CPU seconds in that span of the worker and of `others` by name)."""
    pids = {"worker": worker.pid, **others}
    started = time.monotonic()
    first_at = first_count = None
    cpu_at_first: dict[str, float] = {}
    report_at = started + 10
    while True:
        total = ends.total(topic)
        now = time.monotonic()
        if first_at is None and total > PARTITIONS:  # past the record flow's fence records
            first_at, first_count = now, total
            cpu_at_first = {k: proc_cpu_seconds(pid) for k, pid in pids.items()}
        if total >= n:
            break
        assert worker.poll() is None, "the worker died"
        assert now - started < 300, f"mirror too slow: {total:,}/{n:,} after {now - started:.0f} s"
        if now > report_at:
            progress(f"{topic}: {total:,}/{n:,}")
            report_at += 10
        time.sleep(0.02)
    assert first_at is not None and first_count is not None
    seconds = max(1e-3, now - first_at)
    cpu = {k: proc_cpu_seconds(pid) - cpu_at_first[k] for k, pid in pids.items()}
    return first_at - started, (total - first_count) / seconds, cpu


def _cpu_text(cpu: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())


def _wait_for(ends: _Ends, topic: str, n: int, worker: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while ends.total(topic) < n:
        assert worker.poll() is None, "the worker died"
        assert time.monotonic() < deadline, f"{topic}: fewer than {n:,} records after {timeout_s:.0f} s"
        time.sleep(0.05)


# --------------------------------------------------------------------------- 1. loopback


def test_mirror_topics_vs_record_flow(tmp_path: Path) -> None:
    n = env_int("DCMIRROR_BENCH_MT_RECORDS", 2_000_000)
    source = ClusterProcesses(tmp_path / "source", 1, name="source").start()
    target = ClusterProcesses(tmp_path / "target", 1, name="target").start()
    ends = None
    try:
        create_topic(source.bootstrap, TOPIC)
        prefill = kafka_produce(source.bootstrap, TOPIC, n, payloads(RECORD_BYTES))
        progress(f"source preloaded by librdkafka: {prefill.describe()}")
        ends = _Ends(target.bootstrap)
        src = source.bootstrap.split(",")
        tgt = target.bootstrap.split(",")
        results = {}
        for label, flow, target_name, mirror_topics, topic in (
                ("record flow", "records", "agg", False, f"source.{TOPIC}"),
                ("mirror topics", "topics", "dr", True, TOPIC)):
            topology = _flow_topology(tmp_path, flow, ("source", src), (target_name, tgt),
                                      mirror_topics=mirror_topics, rename="{source}.{topic}" if not mirror_topics
                                      else "{topic}")
            with _worker(topology, flow) as worker:
                startup_s, rate, cpu = _bulk(worker, ends, topic, n, {"source broker": _pid(source),
                                                                      "target broker": _pid(target)})
            results[label] = (startup_s, rate, cpu)
            progress(f"{label}: {rate:,.0f} rec/s (first record after {startup_s:.1f} s; CPU s: {_cpu_text(cpu)})")
        rec, top = results["record flow"], results["mirror topics"]
        # (CPU over the span from the first record to the last: n records, nearly)
        ratio = top[1] / rec[1]
        lines = [f"MIRROR TOPICS vs RECORD FLOW  one worker each, 1-broker source and target, {n:,} records of "
                 f"{RECORD_BYTES} B in {PARTITIONS} partitions preloaded by librdkafka ({prefill.msg_s:,.0f} msg/s)"]
        for label, (startup_s, rate, cpu) in results.items():
            lines.append(f"{label:<14} {rate:>12,.0f} rec/s {rate * RECORD_BYTES / MB:7.1f} MB/s  (first record after "
                         f"{startup_s:.1f} s); CPU seconds per million records: " + ", ".join(
                             f"{k} {v / (n / 1e6):.2f}" for k, v in cpu.items()))
        lines.append(f"mirror topics / record flow: {ratio:.2f}x -> {'MET' if ratio >= 3 else 'NOT MET'} (goal >= 3x)")
        emit("\n".join(lines))
        assert top[1] > 1000 and rec[1] > 1000, "sanity floor"
    finally:
        if ends is not None:
            ends.close()
        source.stop()
        target.stop()


# --------------------------------------------------------------------------- 2. keeping up


def test_mirror_topics_keep_up(tmp_path: Path) -> None:
    seconds = env_int("DCMIRROR_BENCH_MT_KEEPUP_S", 20)
    values = payloads(RECORD_BYTES)
    source = ClusterProcesses(tmp_path / "source", 1, name="source").start()
    target = ClusterProcesses(tmp_path / "target", 1, name="target").start()
    src_ends = tgt_ends = None
    try:
        create_topic(source.bootstrap, TOPIC)
        src_ends, tgt_ends = _Ends(source.bootstrap), _Ends(target.bootstrap)
        topology = _flow_topology(tmp_path, "topics", ("source", source.bootstrap.split(",")),
                                  ("dr", target.bootstrap.split(",")), mirror_topics=True, rename="{topic}")
        p = CkProducer(producer_conf(source.bootstrap))
        with _worker(topology, "topics") as worker:
            # One record per partition copied: the worker has claimed every partition.
            for i in range(PARTITIONS):
                p.produce(TOPIC, values[i], partition=i)
            assert p.flush(30) == 0
            _wait_for(tgt_ends, TOPIC, PARTITIONS, worker, STARTUP_TIMEOUT_S)
            samples: list[tuple[float, int, int]] = []  # (time, source end, target end)
            cpu0 = proc_cpu_seconds(worker.pid)
            target0 = tgt_ends.total(TOPIC)
            # The producer in a process of its own, so that this one samples the ends freely.
            conf = producer_conf(source.bootstrap, **{"delivery.report.only.error": True})
            flood = subprocess.Popen([sys.executable, "-c", FLOOD, TOPIC, str(seconds), json.dumps(conf)],
                                     stdout=subprocess.PIPE)
            while flood.poll() is None:
                samples.append((time.monotonic(), src_ends.total(TOPIC), tgt_ends.total(TOPIC)))
                time.sleep(0.1)
            assert flood.returncode == 0 and flood.stdout is not None
            report = json.loads(flood.stdout.read())
            assert report["failed"] == 0 and report["undelivered"] == 0, report
            start, sent = report["start"], report["sent"]
            acked_at = report["acked"]
            source_total = src_ends.total(TOPIC)
            target_at_ack = tgt_ends.total(TOPIC)
            measured_at = time.monotonic()
            lag_at_ack = source_total - target_at_ack
            _wait_for(tgt_ends, TOPIC, source_total, worker, 120)
            caught_up_s = time.monotonic() - acked_at
            samples.append((time.monotonic(), source_total, source_total))
            cpu_s = proc_cpu_seconds(worker.pid) - cpu0
        produced_s = acked_at - start
        producer_rate = sent / produced_s
        worker_rate = (target_at_ack - target0) / (measured_at - start)
        during = [s for s in samples if start <= s[0] <= acked_at]
        lags = sorted(max(0, s[1] - s[2]) for s in during)
        # A record's lag in seconds, from the samples: how long the target took to reach the
        # source end seen at a sample (the first later sample whose target end is past it).
        lag_s: list[float] = []
        first = samples.index(during[0]) if during else 0
        for i, (t, s_end, _) in enumerate(during):
            later = next((u for u, _, t_end in samples[first + i:] if t_end >= s_end), None)
            if later is not None:
                lag_s.append(later - t)
        lag_s.sort()
        # Kept up: the lag does not grow (the last quarter's worst is at most 2 s of production)
        # and the copy is complete within 2 s of the producer's end.
        quarters = [max((max(0, s[1] - s[2]) for s in during
                         if start + q * produced_s / 4 <= s[0] < start + (q + 1) * produced_s / 4), default=0)
                    for q in range(4)]
        kept_up = caught_up_s <= 2.0 and quarters[-1] <= 2.0 * producer_rate
        lines = [
            f"MIRROR TOPICS KEEP UP  one librdkafka producer as fast as it can for {seconds} s into a 1-broker source "
            f"({PARTITIONS} partitions, {RECORD_BYTES} B), one mirror-topics worker into a 1-broker target",
            f"producer     {producer_rate:>12,.0f} rec/s {producer_rate * RECORD_BYTES / MB:7.1f} MB/s ({sent:,} records, "
            f"all acknowledged after {produced_s:.1f} s)",
            f"worker       {worker_rate:>12,.0f} rec/s over the same span (worker CPU {cpu_s:.1f} s)",
            f"lag while producing ({len(lags)} samples every 100 ms): records p50 {percentile(lags, 50):,.0f}, "
            f"p99 {percentile(lags, 99):,.0f}, max {lags[-1] if lags else 0:,}; seconds p50 "
            f"{percentile(lag_s, 50):.2f}, p99 {percentile(lag_s, 99):.2f}; worst per quarter of the run: "
            + " / ".join(f"{q:,}" for q in quarters) + " records",
            f"when the producer exited ({measured_at - acked_at:.2f} s after its last acknowledgement): {lag_at_ack:,} records behind ({lag_at_ack / producer_rate:.2f} s of "
            f"production); everything copied {caught_up_s:.2f} s after the last acknowledgement -> "
            f"{'KEPT UP' if kept_up else 'FELL BEHIND'} (lag not growing, copy complete within 2 s)",
        ]
        emit("\n".join(lines))
        assert worker_rate > 1000, "sanity floor"
    finally:
        for e in (src_ends, tgt_ends):
            if e is not None:
                e.close()
        source.stop()
        target.stop()


# --------------------------------------------------------------------------- 3. WAN


class _Proxy:
    def __init__(self, listen_port: int, upstream: str, delay_ms: float) -> None:
        self.port = listen_port
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.perf.delay_proxy", "--listen",
                                      f"127.0.0.1:{listen_port}", "--upstream", upstream, "--delay-ms", str(delay_ms)])

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _wan_source(root: Path) -> tuple[ClusterProcesses, dict[str, int]]:
    """One broker with three listeners: PLAINTEXT (itself), WAN and PROXY0, each of the last
    two advertising the proxy in front of it (a client that came through a proxy is sent back
    through it, as through a NAT or a load balancer)."""
    source = ClusterProcesses(root, 1, name="source")
    ports = {"PLAINTEXT": source[1].port, "WAN": free_port(), "PROXY0": free_port(),
             "wan_proxy": free_port(), "proxy0": free_port()}
    config = {
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{ports['PLAINTEXT']},WAN://127.0.0.1:{ports['wan_proxy']},"
                                f"PROXY0://127.0.0.1:{ports['proxy0']}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,WAN:PLAINTEXT,PROXY0:PLAINTEXT",
    }
    if fetch_max_bytes := os.environ.get("DCMIRROR_BENCH_MT_SOURCE_FETCH_MAX_BYTES"):
        config["fetch.max.bytes"] = fetch_max_bytes  # the broker's cap on one fetch answer
    # The cluster's table is the last of its topology file.
    with open(source.topology_path, "a") as f:
        f.write(f'listeners = {{ WAN = ["127.0.0.1:{ports["WAN"]}"], PROXY0 = ["127.0.0.1:{ports["PROXY0"]}"] }}\n')
        f.write("config = { " + ", ".join(f'"{k}" = "{v}"' for k, v in config.items()) + " }\n")
    return source, ports


def _consumer_settings(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def _paced_lag(source_bootstrap: str, target_bootstrap: str, topic: str, rate: int, seconds: int) -> list[float]:
    """Write rate records/s for `seconds` into the source; each record's lag on arrival in the
    target's `topic` (arrival - the record's timestamp), sorted."""
    values = payloads(RECORD_BYTES)
    total = rate * seconds
    consumer = CkConsumer({"bootstrap.servers": target_bootstrap, "group.id": "bench-lag",
                           "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p))[1] for p in range(PARTITIONS)}
    consumer.assign([TopicPartition(topic, p, ends[p]) for p in range(PARTITIONS)])

    def produce() -> None:
        p = CkProducer(producer_conf(source_bootstrap, **{"linger.ms": 5}))
        start = time.monotonic()
        for i in range(total):
            if i % 100 == 0:
                due = start + i / rate
                wait = due - time.monotonic()
                if wait > 0:
                    p.poll(wait)
            p.produce(topic_source, values[i & 1023])
        p.flush(60)

    topic_source = TOPIC
    producer = threading.Thread(target=produce)
    producer.start()
    lags: list[float] = []
    deadline = time.monotonic() + seconds + 60
    while len(lags) < total and time.monotonic() < deadline:
        for m in consumer.consume(1000, 0.2):
            if m.error() is None and m.value() is not None:
                lags.append(time.time() - m.timestamp()[1] / 1000)
    producer.join()
    consumer.close()
    assert len(lags) == total, f"only {len(lags):,} of {total:,} paced records arrived in {topic}"
    return sorted(lags)


def test_mirror_topics_wan(tmp_path: Path) -> None:
    n = env_int("DCMIRROR_BENCH_MT_WAN_RECORDS", 2_000_000)
    delay_ms = env_int("DCMIRROR_BENCH_MT_WAN_DELAY_MS", 50)
    paced_rate = env_int("DCMIRROR_BENCH_MT_PACED_RATE", 20_000)
    paced_s = env_int("DCMIRROR_BENCH_MT_PACED_S", 10)
    wan_consumer = _consumer_settings(os.environ.get("DCMIRROR_BENCH_MT_WAN_CONSUMER", ""))
    source, ports = _wan_source(tmp_path / "source")
    source.start()
    target = ClusterProcesses(tmp_path / "target", 1, name="target").start()
    wan = _Proxy(ports["wan_proxy"], f"127.0.0.1:{ports['WAN']}", delay_ms)
    proxy0 = _Proxy(ports["proxy0"], f"127.0.0.1:{ports['PROXY0']}", 0)
    ends = None
    try:
        create_topic(source.bootstrap, TOPIC)
        prefill = kafka_produce(source.bootstrap, TOPIC, n, payloads(RECORD_BYTES))
        progress(f"source preloaded by librdkafka: {prefill.describe()}")
        consume = {}
        for label, bootstrap in (("loopback", source.bootstrap), ("proxy 0 ms", proxy0.bootstrap),
                                 (f"proxy {delay_ms} ms", wan.bootstrap)):
            consume[label] = kafka_consume(bootstrap, TOPIC, PARTITIONS, n, progress_every_s=0)
            progress(f"librdkafka consumer, {label}: {consume[label].describe()}")
        ends = _Ends(target.bootstrap)
        tgt = target.bootstrap.split(",")
        runs = {}
        # Loopback, the 0 ms proxy (what the proxy itself costs the worker; bulk only), then
        # the WAN; each into a mirror topic of its own in the target (the later workers also
        # copy the loopback phase's paced records: n + paced in all).
        paced_n = paced_rate * paced_s
        for label, flow, brokers, consumer, expected, proxy in (
                ("loopback", "lan", source.bootstrap.split(","), {}, n, None),
                ("proxy 0 ms", "p0", [proxy0.bootstrap], wan_consumer, n + paced_n, proxy0),
                (f"WAN {2 * delay_ms} ms RTT", "wan", [wan.bootstrap], wan_consumer, n + paced_n, wan)):
            topic = f"{flow}.{TOPIC}"
            topology = _flow_topology(tmp_path, flow, (f"src{flow}", brokers), ("dr", tgt), mirror_topics=True,
                                      rename=f"{flow}.{{topic}}", consumer=consumer)
            with _worker(topology, flow) as worker:
                others = {"source broker": _pid(source), "target broker": _pid(target)}
                if proxy is not None:
                    others["proxy"] = proxy.proc.pid
                startup_s, rate, cpu = _bulk(worker, ends, topic, expected, others)
                progress(f"mirror topics, {label}: {rate:,.0f} rec/s (first record after {startup_s:.1f} s, "
                         f"CPU s: {_cpu_text(cpu)})")
                lags: list[float] = []
                if proxy is not proxy0:
                    lags = _paced_lag(source.bootstrap, target.bootstrap, topic, paced_rate, paced_s)
                    progress(f"mirror topics, {label}, paced: lag p50 {percentile(lags, 50) * 1000:.0f} ms, "
                             f"p99 {percentile(lags, 99) * 1000:.0f} ms")
            runs[label] = (startup_s, rate, cpu, lags)
        (_, lan), (_, p0), (wan_label, wan_run) = list(runs.items())
        ratio = wan_run[1] / lan[1]
        base = consume["loopback"].msg_s
        lines = [f"MIRROR TOPICS OVER A WAN  delaying TCP proxy (tests/perf/delay_proxy.py) {delay_ms} ms each way "
                 f"in front of a 1-broker source, {n:,} records of {RECORD_BYTES} B in {PARTITIONS} partitions"
                 + (f"; consumer settings of the workers behind proxies {wan_consumer}" if wan_consumer else "")
                 + f"; num.replica.fetchers {os.environ.get('DCMIRROR_BENCH_MT_FETCHERS') or 'default'}"]
        for label, r in consume.items():
            lines.append(f"librdkafka consumer, {label:<14} {r.msg_s:>12,.0f} msg/s {r.mb_s:7.1f} MB/s  "
                         f"{r.msg_s / base:.2f}x of loopback")
        for label, (startup_s, rate, cpu, lags) in runs.items():
            lines.append(f"mirror topics, {label:<16} {rate:>12,.0f} rec/s {rate * RECORD_BYTES / MB:7.1f} MB/s  "
                         f"(first record after {startup_s:.1f} s; CPU s: {_cpu_text(cpu)})"
                         + (f"; lag at {paced_rate:,} rec/s: p50 {percentile(lags, 50) * 1000:.0f} ms, "
                            f"p99 {percentile(lags, 99) * 1000:.0f} ms" if lags else ""))
        lines.append(f"mirror topics {wan_label} / loopback: {ratio:.2f}x -> {'MET' if ratio >= 0.8 else 'NOT MET'} "
                     f"(goal >= 0.8x); / through the 0 ms proxy: {wan_run[1] / p0[1]:.2f}x (the round trips alone); "
                     f"0 ms proxy / loopback: {p0[1] / lan[1]:.2f}x (the proxy alone)")
        emit("\n".join(lines))
        assert wan_run[1] > 1000, "sanity floor"
    finally:
        if ends is not None:
            ends.close()
        wan.stop()
        proxy0.stop()
        source.stop()
        target.stop()
