"""The replication fault tests' workload and verifier (issue 5).

A librdkafka idempotent producer with acks=all writes unique sequential values ("0", "1", ...;
value i goes to partition i % partitions) from a background thread at a steady pace, while a
test injects faults. Afterwards `verify` reads every partition from the beginning and checks,
per partition: every acknowledged value is there at its acknowledged offset (0 lost), no value
appears twice (0 duplicates), values ascend with the offsets (order kept). `verify_replicas`
runs `dcmirror verify-replicas` once the ISR is whole again: every replica byte-identical up
to the high watermark, none lagging.

Fault schedules come from `fault_rng(name)`: in `make test` a fixed seed per schedule (derived
from its name); DCMIRROR_FAULT_NEW_SEEDS=1 (`make soak`) draws new ones; DCMIRROR_FAULT_SEED=N
replays one. The seed is printed either way.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.cluster_helpers import NotYet, metadata, partitions_of, wait_until
from tests.harness import REPO, ClusterProcesses


def fixed_fault_seed(name: str) -> int:
    """The seed `make test` runs the schedule `name` with: the same in every run and process
    (not hash(), which PYTHONHASHSEED salts)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") >> 1


def fault_rng(name: str) -> random.Random:
    """A seeded RNG for the fault schedule `name` (unique per test); prints the seed.
    DCMIRROR_FAULT_SEED=N replays seed N; else DCMIRROR_FAULT_NEW_SEEDS=1 (make soak) draws a
    new one; else (make test) the schedule's fixed seed, fixed_fault_seed(name)."""
    if os.environ.get("DCMIRROR_FAULT_SEED"):
        seed, how = int(os.environ["DCMIRROR_FAULT_SEED"]), "replayed"
    elif os.environ.get("DCMIRROR_FAULT_NEW_SEEDS", "") not in ("", "0"):
        seed, how = random.SystemRandom().randrange(1 << 31), "new"
    else:
        seed, how = fixed_fault_seed(name), "fixed"
    print(f"\n{name}: fault seed {seed} ({how}; replay with DCMIRROR_FAULT_SEED={seed})", flush=True)
    return random.Random(seed)


@dataclass
class Acked:
    partition: int
    offset: int
    value: int


@dataclass
class WorkloadResult:
    sent: int
    acked: list[Acked]
    errors: Counter[str] = field(default_factory=Counter)
    ack_times: list[tuple[float, int]] = field(default_factory=list)  # (time.monotonic(), partition)

    def unavailability(self, partitions: set[int], after: float, before: float) -> float:
        """Longest gap between consecutive acknowledgements of any of `partitions` within
        [after, before] (the window's edges count as acknowledgements): how long writes to
        them were unavailable around a fault."""
        worst = 0.0
        for p in partitions:
            times = [after] + [t for t, q in self.ack_times if q == p and after <= t <= before] + [before]
            worst = max(worst, max(b - a for a, b in zip(times, times[1:], strict=False)))
        return worst


class ProducerWorkload:
    """Paced idempotent acks=all producer in a thread; `stop()` flushes and returns the result."""

    def __init__(self, bootstrap: str, topic: str, partitions: int = 6, rate_per_s: float = 2000.0,
                 **producer_config: Any) -> None:
        self.topic, self.partitions, self.rate_per_s = topic, partitions, rate_per_s
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "message.timeout.ms": 120_000, "request.timeout.ms": 10_000,
            "socket.connection.setup.timeout.ms": 3000, "reconnect.backoff.max.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000, "log_level": 2,
        }
        if os.environ.get("DCMIRROR_WORKLOAD_DEBUG"):  # e.g. "eos,msg": librdkafka's view on stderr
            conf.update(debug=os.environ["DCMIRROR_WORKLOAD_DEBUG"], log_level=7)
        conf.update(producer_config)
        self.producer = Producer(conf)
        self._lock = threading.Lock()
        self._acked: list[Acked] = []
        self._ack_times: list[tuple[float, int]] = []
        self._errors: Counter[str] = Counter()
        self._sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        with self._lock:
            if err is not None:
                self._errors[err.name()] += 1
                return
            self._acked.append(Acked(msg.partition(), msg.offset(), int(msg.value())))
            self._ack_times.append((time.monotonic(), msg.partition()))

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - start) * self.rate_per_s)
            while self._sent < due and not self._stop.is_set():
                i = self._sent
                try:
                    self.producer.produce(self.topic, value=str(i).encode(), partition=i % self.partitions,
                                          on_delivery=self._delivered)
                except BufferError:
                    self.producer.poll(0.05)
                    continue
                self._sent += 1
            self.producer.poll(0.005)

    def start(self) -> ProducerWorkload:
        self._thread.start()
        return self

    @property
    def acked_count(self) -> int:
        with self._lock:
            return len(self._acked)

    def acked_since(self, partitions: set[int], since: float) -> bool:
        """Has every one of `partitions` had a write acknowledged after time.monotonic() `since`?"""
        with self._lock:
            pending = set(partitions)
            for t, p in reversed(self._ack_times):
                if t <= since:
                    break
                pending.discard(p)
            return not pending

    def wait_acked(self, count: int, timeout_s: float = 60.0, cluster: ClusterProcesses | None = None) -> None:
        wait_until(lambda: self.acked_count >= count, timeout_s,
                   f"{count} acknowledged records (errors so far: {dict(self._errors)})", cluster)

    def stop(self, flush_timeout_s: float = 150.0) -> WorkloadResult:
        self._stop.set()
        self._thread.join()
        left = self.producer.flush(flush_timeout_s)
        assert left == 0, f"{left} records still unacknowledged after {flush_timeout_s}s"
        with self._lock:
            return WorkloadResult(self._sent, list(self._acked), Counter(self._errors), list(self._ack_times))


@dataclass
class Verification:
    consumed: int
    lost: list[Acked]
    duplicates: list[int]
    out_of_order: list[tuple[int, int]]  # (partition, offset)
    wrong_offset: list[tuple[Acked, int]]
    unacknowledged_present: int  # sent, not acknowledged (timed out / failed), yet written

    def assert_clean(self) -> None:
        problems = []
        if self.lost:
            problems.append(f"{len(self.lost)} acknowledged records lost, e.g. {self.lost[:5]}")
        if self.duplicates:
            problems.append(f"{len(self.duplicates)} duplicated values, e.g. {self.duplicates[:5]}")
        if self.out_of_order:
            problems.append(f"{len(self.out_of_order)} records out of order, e.g. {self.out_of_order[:5]}")
        if self.wrong_offset:
            problems.append(f"{len(self.wrong_offset)} records at another offset than acknowledged, "
                            f"e.g. {self.wrong_offset[:5]}")
        assert not problems, "; ".join(problems)


def read_all(bootstrap: str, topic: str, partitions: int, timeout_s: float = 120.0) -> dict[int, list[tuple[int, int]]]:
    """Every (offset, value) of every partition, from the beginning to the high watermark."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verifier-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "enable.partition.eof": True, "log_level": 2})
    try:
        ends = {}
        for p in range(partitions):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: dict[int, list[tuple[int, int]]] = {p: [] for p in range(partitions)}
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + timeout_s
        while len(done) < partitions:
            assert time.monotonic() < deadline, f"verifier read {sum(map(len, out.values()))} records, not done"
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= ends[msg.partition()]:
                            done.add(msg.partition())
                        continue
                    raise AssertionError(f"verifier consumer error: {msg.error()}")
                out[msg.partition()].append((msg.offset(), int(msg.value())))
                if msg.offset() + 1 >= ends[msg.partition()]:
                    done.add(msg.partition())
        return out
    finally:
        consumer.close()


def verify(bootstrap: str, topic: str, partitions: int, result: WorkloadResult) -> Verification:
    data = read_all(bootstrap, topic, partitions)
    seen: Counter[int] = Counter()
    at: dict[int, tuple[int, int]] = {}
    out_of_order = []
    for p, rows in data.items():
        last = -1
        for offset, value in rows:
            seen[value] += 1
            at[value] = (p, offset)
            if value <= last or value % partitions != p:
                out_of_order.append((p, offset))
            last = value
    lost = [a for a in result.acked if a.value not in at]
    wrong = [(a, at[a.value][1]) for a in result.acked if a.value in at and at[a.value] != (a.partition, a.offset)]
    acked_values = {a.value for a in result.acked}
    return Verification(
        consumed=sum(len(rows) for rows in data.values()),
        lost=lost,
        duplicates=sorted(v for v, n in seen.items() if n > 1),
        out_of_order=out_of_order,
        wrong_offset=wrong,
        unacknowledged_present=sum(1 for v in seen if v not in acked_values),
    )


def wait_fully_replicated(cluster: ClusterProcesses, topic: str, partitions: int, rf: int,
                          timeout_s: float = 60.0) -> None:
    """Every partition has a leader and its whole replica set in the ISR."""
    def whole() -> bool:
        parts = partitions_of(metadata(cluster.bootstrap_of(*cluster.alive()), topic), topic)
        short = {i: p for i, p in parts.items() if p.leader < 0 or len(p.isr) != rf}
        if len(parts) != partitions or short:
            raise NotYet(f"{len(parts)} partitions; not whole: {short}")
        return True
    wait_until(whole, timeout_s, f"{topic}: every partition with a leader and {rf} in-sync replicas", cluster)


def verify_replicas(cluster: ClusterProcesses, topic: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """`dcmirror verify-replicas --json` until every replica is consistent and caught up
    (followers may still be fetching the last batches); the final report."""
    last: list[dict[str, Any]] = []

    def consistent() -> bool:
        nonlocal last
        proc = subprocess.run([sys.executable, "-m", "deploy.cli", "verify-replicas", topic, "--json",
                               "--config", str(cluster.topology_path), "--cluster", cluster.name],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        if not proc.stdout.strip():
            return False
        last = json.loads(proc.stdout.strip().splitlines()[-1])
        return proc.returncode == 0 and all(
            r["status"] == "ok" and r["lag"] == 0 for p in last for r in p["replicas"])
    wait_until(consistent, timeout_s, f"verify-replicas {topic}: consistent, lag 0", cluster, interval_s=1.0)
    assert all(r["batches_compared"] > 0 for p in last for r in p["replicas"] if p["high_watermark"] > 0)
    return last


def check_outcome(cluster: ClusterProcesses, workload: ProducerWorkload, rf: int = 3,
                  result: WorkloadResult | None = None) -> WorkloadResult:
    """The end of every replication fault scenario: stop the workload (unless `result` is
    given), wait for whole ISRs, then 0 lost, 0 duplicates, order and acknowledged offsets kept,
    every send acknowledged, replicas byte-identical (verify-replicas)."""
    if result is None:
        result = workload.stop()
    wait_fully_replicated(cluster, workload.topic, workload.partitions, rf)
    outcome = verify(cluster.bootstrap, workload.topic, workload.partitions, result)
    print(f"sent {result.sent}, acknowledged {len(result.acked)}, consumed {outcome.consumed}, "
          f"unacknowledged but written {outcome.unacknowledged_present}, delivery errors {dict(result.errors)}")
    outcome.assert_clean()
    assert len(result.acked) == result.sent, f"delivery errors: {dict(result.errors)}"
    verify_replicas(cluster, workload.topic)
    return result
