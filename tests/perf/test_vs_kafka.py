"""dcmirror beside Apache Kafka (the pinned peer, `make peers`): the same clients, record
size and count against each, one system at a time, ratios printed (dcmirror / Kafka).

Run with `make bench` (or `pytest -m perf -q -s tests/perf/test_vs_kafka.py`). Knobs:

  DCMIRROR_BENCH_KAFKA_RECORDS   records per throughput phase (default 1,000,000, 200 bytes each)
  DCMIRROR_BENCH_KAFKA_RESTART_MB  data written before the restart phase (default 1024 MiB)
  DCMIRROR_BENCH_KAFKA_KILLS     leader kills per system (default 3)

Phases, each against dcmirror then against Kafka 4.3.1 (KRaft, combined nodes):
  1. one broker: librdkafka produce (acks=1, 6 partitions) and consume; Kafka's own
     kafka-producer-perf-test and kafka-consumer-perf-test; the broker's resident memory
     (peak while producing, after consuming);
  2. three brokers, RF 3, acks=all, idempotent producer;
  3. time to resume writes after kill -9 of a partition leader (three brokers): from the kill
     to the first record produced after it being acknowledged;
  4. restart after kill -9 of a broker holding ~1 GiB in 60 partitions: until it answers
     Metadata with a leader for every partition and takes a write.
Nothing is asserted about speed; figures go to tests/perf/results/latest.txt.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.harness import BrokerProcess, ClusterProcesses
from tests.peers.kafka import KAFKA_VERSION, KafkaCluster, run_tool
from tests.perf.benchlib import (
    PARTITIONS,
    RECORD_BYTES,
    Alternated,
    emit,
    env_int,
    kafka_consume,
    kafka_produce,
    measure,
    payloads,
    progress,
)

pytestmark = pytest.mark.perf


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class PeakRss:
    """The largest resident set of some processes while the block runs (sampled every 100 ms)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak_mib = 0.0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak_mib = max(self.peak_mib, sum(rss_mib(p) for p in self.pids))

    def __enter__(self) -> PeakRss:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class System:
    """One of the two, as a started set of processes."""

    name: str
    bootstrap: str
    pids: list[int]
    kill9: Callable[[int], None]  # node id
    restart: Callable[[int], None]
    stop: Callable[[], None]
    extra: dict[str, Any] = field(default_factory=dict)


# Broker settings both systems run with: Kafka's test harness (tests/peers/kafka.py) sets
# these, and dcmirror's defaults differ in one (group.initial.rebalance.delay.ms, Kafka's
# server default 3,000 ms, which made kafka-consumer-perf-test's join 3 s longer on dcmirror).
BENCH_BROKER_CONFIG: dict[str, object] = {"group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 50,
                                          "auto.create.topics.enable": "false", "num.partitions": 1}


@contextmanager
def dcmirror(root: Path, size: int) -> Iterator[System]:
    if size == 1:
        broker = BrokerProcess(root / "broker", **BENCH_BROKER_CONFIG).start()
        assert broker.proc is not None
        system = System("dcmirror", broker.bootstrap, [broker.proc.pid], lambda _n: broker.kill9(),
                        lambda _n: broker.start(120), lambda: broker.stop())
    else:
        cluster = ClusterProcesses(root / "cluster", size, **BENCH_BROKER_CONFIG).start()

        def restart(node: int) -> None:
            cluster[node].start(120)

        system = System("dcmirror", cluster.bootstrap, [b.proc.pid for b in cluster.brokers.values() if b.proc],
                        lambda n: cluster[n].kill9(), restart, lambda: cluster.stop())
    try:
        yield system
    finally:
        system.stop()


@contextmanager
def kafka(root: Path, size: int) -> Iterator[System]:
    cluster = KafkaCluster(root / "kafka", size, config=BENCH_BROKER_CONFIG).start()

    def restart(node: int) -> None:
        cluster[node].start()
        cluster[node].wait_listening(120)

    system = System("kafka", cluster.bootstrap, [n.proc.pid for n in cluster.nodes.values() if n.proc],
                    lambda n: cluster[n].kill9(), restart, cluster.stop, {"cluster": cluster})
    try:
        yield system
    finally:
        cluster.stop()


SYSTEMS = (("dcmirror", dcmirror), ("kafka", kafka))


def make_topic(bootstrap: str, name: str, partitions: int, rf: int = 1, config: dict[str, str] | None = None) -> None:
    client = AdminClient({"bootstrap.servers": bootstrap})
    client.create_topics([NewTopic(name, partitions, rf, config=config or {})])[name].result(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        t = client.list_topics(topic=name, timeout=10).topics.get(name)
        if t is not None and t.error is None and len(t.partitions) == partitions and all(
                p.leader >= 0 and len(p.isrs) == rf for p in t.partitions.values()):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {name} not ready")


PERF_LINE = re.compile(r"([\d.]+) records/sec")


def perf_tools(bootstrap: str, topic: str, n: int, root: Path) -> tuple[dict[str, float | None], str]:
    """kafka-producer-perf-test and kafka-consumer-perf-test. The consumer tool's records/s
    divides by a time that includes joining its group; its fetch phase and the join are
    reported apart (fetch.nMsg.sec, rebalance.time.ms)."""
    prod = run_tool("kafka-producer-perf-test", "--topic", topic, "--num-records", str(n), "--record-size",
                    str(RECORD_BYTES), "--throughput", "-1", "--producer-props", f"bootstrap.servers={bootstrap}",
                    "acks=1", "linger.ms=5", "batch.size=1048576", cwd=root, timeout_s=600,
                    jvm=("-Xmx512m",))
    last = prod.stdout.strip().splitlines()[-1] if prod.stdout.strip() else prod.stderr[-300:]
    found = PERF_LINE.findall(last)
    out: dict[str, float | None] = {"perf_produce": float(found[0]) if prod.returncode == 0 and found else None}
    cons = run_tool("kafka-consumer-perf-test", "--bootstrap-server", bootstrap, "--topic", topic, "--messages",
                    str(n), "--timeout", "60000", cwd=root, timeout_s=600, jvm=("-Xmx512m",))
    lines = [x for x in cons.stdout.splitlines() if x.strip()]
    heads = [i for i, line in enumerate(lines) if "nMsg.sec" in line]
    row: dict[str, str] = {}
    if cons.returncode == 0 and heads and heads[0] + 1 < len(lines):
        header = [h.strip() for h in lines[heads[0]].split(",")]
        values = [v.strip() for v in lines[heads[0] + 1].split(",")]
        row = dict(zip(header, values, strict=False))

    def number(key: str) -> float | None:
        try:
            return float(row[key])
        except (KeyError, ValueError):
            return None

    out |= {"perf_consume": number("nMsg.sec"), "perf_consume_fetch": number("fetch.nMsg.sec"),
            "perf_consume_join_ms": number("rebalance.time.ms")}
    note = "" if out["perf_produce"] and out["perf_consume"] else (
        f"producer: {last[-200:]} consumer rc {cons.returncode}: {cons.stdout[-300:]} {cons.stderr[-300:]}")
    return out, note


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "n/a"


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} s" if unit == "s" else f"{value:,.0f} {unit}"


def table(title: str, rows: list[tuple[str, float | None, float | None, str]]) -> str:
    """rows: (figure, dcmirror, kafka, unit)."""
    out = [title, f"  {'':<44} {'dcmirror':>12} {'Kafka ' + KAFKA_VERSION:>14} {'dcmirror/Kafka':>15}"]
    for name, dc, kf, unit in rows:
        out.append(f"  {name:<44} {_fmt(dc, unit):>12} {_fmt(kf, unit):>14} {ratio(dc, kf):>15}")
    return "\n".join(out)


@pytest.mark.timeout(6 * 3600)
def test_one_broker_and_three_brokers_beside_kafka(tmp_path: Path) -> None:
    n = env_int("DCMIRROR_BENCH_KAFKA_RECORDS", 1_000_000)
    rounds = env_int("DCMIRROR_BENCH_KAFKA_ROUNDS", 3)
    values = payloads()
    figures = Alternated()
    notes: list[str] = []
    for round_no in range(rounds):
        order = SYSTEMS if round_no % 2 == 0 else SYSTEMS[::-1]
        for name, start in order:
            progress(f"round {round_no + 1}/{rounds}, {name}: one broker")
            with start(tmp_path / f"{name}-1-{round_no}", 1) as system:
                make_topic(system.bootstrap, "bench", PARTITIONS)
                with PeakRss(system.pids) as peak:
                    rate = measure({"broker": system.pids[0]}, kafka_produce, system.bootstrap, "bench", n, values)
                figures.add("produce", name, rate.msg_s)
                figures.add("rss_peak", name, peak.peak_mib)
                notes.append(f"round {round_no + 1} {name} produce: {rate.describe()}")
                rate = measure({"broker": system.pids[0]}, kafka_consume, system.bootstrap, "bench", PARTITIONS, n + 1)
                figures.add("consume", name, rate.msg_s)
                figures.add("rss_after", name, rss_mib(system.pids[0]))
                notes.append(f"round {round_no + 1} {name} consume: {rate.describe()}")
                make_topic(system.bootstrap, "bench-tools", PARTITIONS)
                tools, note = perf_tools(system.bootstrap, "bench-tools", n, tmp_path)
                for key, got in tools.items():
                    figures.add(key, name, got)
                if note:
                    notes.append(f"round {round_no + 1} {name} perf tools: {note}")
            progress(f"round {round_no + 1}/{rounds}, {name}: three brokers, RF 3, acks=all")
            with start(tmp_path / f"{name}-3-{round_no}", 3) as system:
                make_topic(system.bootstrap, "bench-rf3", PARTITIONS, rf=3, config={"min.insync.replicas": "2"})
                rate = kafka_produce(system.bootstrap, "bench-rf3", n, values, acks="all",
                                     **{"enable.idempotence": True})
                figures.add("produce_rf3", name, rate.msg_s)
                notes.append(f"round {round_no + 1} {name} 3 brokers acks=all: {rate.describe()}")
                figures.add("resume_s", name, median_resume(system, env_int("DCMIRROR_BENCH_KAFKA_KILLS", 1), notes))
    emit("\n".join([
        f"=== dcmirror beside Apache Kafka {KAFKA_VERSION}: {n:,} x {RECORD_BYTES}-byte records, {PARTITIONS} "
        f"partitions, {rounds} alternated rounds ===",
        "the same broker settings on both sides: " + ", ".join(f"{k}={v}" for k, v in BENCH_BROKER_CONFIG.items()),
        figures.render("one broker", [
            ("produce", "librdkafka produce, acks=1 (msg/s)", "/s"),
            ("consume", "librdkafka consume, assigned (msg/s)", "/s"),
            ("perf_produce", "kafka-producer-perf-test (records/s)", "/s"),
            ("perf_consume", "kafka-consumer-perf-test, whole run (msg/s)", "/s"),
            ("perf_consume_join_ms", "  of it, joining the group (ms; lower is better)", "ms"),
            ("perf_consume_fetch", "  of it, the fetch phase (msg/s)", "/s"),
            ("rss_peak", "broker resident memory, peak producing (MiB)", "MiB"),
            ("rss_after", "broker resident memory after consuming (MiB)", "MiB"),
        ], ("dcmirror", f"Kafka {KAFKA_VERSION}")),
        figures.render("three brokers", [
            ("produce_rf3", "RF 3, acks=all, idempotent produce (msg/s)", "/s"),
            ("resume_s", "writes resume after kill -9 of a leader (s)", "s"),
        ], ("dcmirror", f"Kafka {KAFKA_VERSION}")),
        "ratio: dcmirror / Kafka per round (for times and memory lower is better); load: 1-minute load average",
        *notes]))


class Acks:
    """A delivery callback keeping when each record was acknowledged."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.times.append(time.monotonic())


def median_resume(system: System, kills: int, notes: list[str]) -> float | None:
    """kill -9 the leader of a 1-partition RF 3 topic `kills` times: seconds from the kill to
    the first record produced after it being acknowledged; the node restarts between runs."""
    times = []
    for run in range(kills):
        topic = f"resume-{run}"
        make_topic(system.bootstrap, topic, 1, rf=3, config={"min.insync.replicas": "2"})
        client = AdminClient({"bootstrap.servers": system.bootstrap})
        leader = client.list_topics(topic=topic, timeout=10).topics[topic].partitions[0].leader
        acked = Acks()
        p = Producer({"bootstrap.servers": system.bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 0, "message.timeout.ms": 120_000, "topic.metadata.refresh.interval.ms": 250,
                      "log_level": 2})
        p.produce(topic, b"warm", partition=0)
        p.flush(30)
        killed_at = time.monotonic()
        system.kill9(leader)

        deadline = killed_at + 120
        while not acked.times and time.monotonic() < deadline:
            p.produce(topic, b"x", partition=0, on_delivery=acked)
            p.poll(0.05)
        p.flush(30)
        if acked.times:
            times.append(acked.times[0] - killed_at)
        system.restart(leader)
    notes.append(f"{system.name} resume after leader kill: " + ", ".join(f"{t:.2f}s" for t in times))
    return sorted(times)[len(times) // 2] if times else None


@pytest.mark.timeout(3 * 3600)
def test_restart_after_kill9_with_a_gibibyte_in_sixty_partitions(tmp_path: Path) -> None:
    mib = env_int("DCMIRROR_BENCH_KAFKA_RESTART_MB", 1024)
    n = mib * 2**20 // RECORD_BYTES
    values = payloads()
    got: dict[str, float | None] = {}
    notes = []
    for name, start in SYSTEMS:
        with start(tmp_path / f"{name}-restart", 1) as system:
            make_topic(system.bootstrap, "big", 60)
            rate = kafka_produce(system.bootstrap, "big", n, values)
            notes.append(f"{name}: wrote {mib} MiB: {rate.describe()}")
            system.kill9(1)
            t = time.monotonic()
            system.restart(1)
            p = Producer({"bootstrap.servers": system.bootstrap, "acks": "all", "message.timeout.ms": 300_000,
                          "log_level": 2})
            acked = Acks()
            p.produce("big", b"after", partition=59, on_delivery=acked)
            p.flush(300)
            got[name] = (acked.times[0] - t) if acked.times else None
    emit("\n".join([table(f"restart after kill -9 with {mib} MiB in 60 partitions (to the first acknowledged write)",
                          [("restart to first write", got.get("dcmirror"), got.get("kafka"), "s")]), *notes]))
