"""Exactly once through failures: a librdkafka consume-transform-produce application
(tests/fault/ctp_app.py, send_offsets_to_transaction) over a 3-broker RF=3 cluster while the
transaction coordinator, a partition leader and the application itself are killed with
SIGKILL, several times, in a seeded order (replay: DCMIRROR_FAULT_SEED=N).

What must hold at the end:
- every input record appears in the output exactly once for a read_committed consumer,
  with its value, in input order per partition (an aborted record read would be a second
  copy of an input record: every input record is committed in the end);
- the group's committed offsets are exactly the input's end offsets;
- the last stable offset of every output partition, watched throughout through ListOffsets
  (read_committed) with librdkafka's admin client, never moved back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from cluster.groups.records import partition_for
from tests.cluster_helpers import NotYet, metadata, partitions_of, wait_until, watermarks
from tests.fault.ctp_app import GROUP, TXN_ID
from tests.fault_workload import ProducerWorkload, fault_rng, wait_fully_replicated
from tests.harness import ClusterProcesses

REPO = Path(__file__).resolve().parents[2]
SOURCE, SINK, PARTITIONS, RF = "ctp-in", "ctp-out", 3, 3


class Application:
    """ctp_app as a child process, restarted whenever it exits until `finish()`."""

    def __init__(self, bootstrap: str, workdir: Path) -> None:
        self.bootstrap, self.stop_file = bootstrap, workdir / "ctp.stop"
        self.log_path = workdir / "ctp_app.log"
        self.log = self.log_path.open("ab")
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: list[int] = []
        self._lock = threading.Lock()
        self._finishing = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="ctp-supervisor", daemon=True)

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fault.ctp_app", self.bootstrap, SOURCE, SINK, str(self.stop_file)],
            cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "CTP_HOLD_S": "0.4"})

    def _supervise(self) -> None:
        while not self._finishing.is_set():
            with self._lock:
                assert self.proc is not None
                code = self.proc.poll()
                if code is not None:
                    self.exits.append(code)
                    self._spawn()
            time.sleep(0.1)

    def start(self) -> Application:
        self._spawn()
        self._thread.start()
        return self

    def kill9_in_transaction(self, timeout_s: float = 60.0) -> None:
        """SIGKILL while a transaction is open with its records written (the next "in
        transaction" line of the log)."""
        before = self.text().count("in transaction")
        wait_until(lambda: self.text().count("in transaction") > before, timeout_s, "an open transaction")
        with self._lock:
            assert self.proc is not None
            self.proc.kill()

    def finish(self, timeout_s: float = 60.0) -> int:
        self.stop_file.touch()
        self._finishing.set()
        self._thread.join()
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            print(f"the application did not stop within {timeout_s:.0f} s of the stop file: killed")
            return -9
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")


class StableOffsetWatch:
    """ListOffsets(latest, read_committed) of every output partition every 200 ms; any answer
    below an earlier one for the same partition is a regression."""

    def __init__(self, bootstrap: str) -> None:
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
        self.seen: dict[int, int] = {}
        self.answers = 0
        self.regressions: list[tuple[int, int, int]] = []  # (partition, before, after)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lso-watch", daemon=True)

    def _run(self) -> None:
        request = {TopicPartition(SINK, p): OffsetSpec.latest() for p in range(PARTITIONS)}
        while not self._stop.is_set():
            try:
                futures = self.admin.list_offsets(request, isolation_level=IsolationLevel.READ_COMMITTED,
                                                  request_timeout=5)
                for tp, fut in futures.items():
                    try:
                        offset = fut.result().offset
                    except KafkaException:
                        continue  # leader moving: no answer is not a regression
                    if offset < 0:
                        continue  # OFFSET_INVALID (-1001): no answer either
                    before = self.seen.get(tp.partition, -1)
                    if offset < before:
                        self.regressions.append((tp.partition, before, offset))
                    self.seen[tp.partition] = max(before, offset)
                    self.answers += 1
            except KafkaException:
                pass
            self._stop.wait(0.2)

    def start(self) -> StableOffsetWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def read_partitions(bootstrap: str, topic: str, isolation: str) -> dict[int, list[tuple[int, bytes | None, bytes]]]:
    """(offset, key, value) per partition, from the start to the end a fresh consumer reaches."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex[:8]}",
                  "isolation.level": isolation, "enable.auto.commit": False, "enable.partition.eof": True,
                  "log_level": 2})
    try:
        ends = {p: watermarks(c, topic, p)[1] for p in range(PARTITIONS)}
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        out: dict[int, list[tuple[int, bytes | None, bytes]]] = {p: [] for p in range(PARTITIONS)}
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 120
        while len(done) < PARTITIONS:
            assert time.monotonic() < deadline, f"read {sum(map(len, out.values()))} of {topic}, not at {ends}"
            for m in c.consume(10_000, timeout=1.0):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= ends[m.partition()]:
                            done.add(m.partition())
                        continue
                    raise AssertionError(f"consumer error: {m.error()}")
                out[m.partition()].append((m.offset(), m.key(), m.value()))
        return out
    finally:
        c.close()


def coordinator_of(cluster: ClusterProcesses) -> int:
    parts = partitions_of(metadata(cluster.bootstrap_of(*cluster.alive()), "__transaction_state"),
                          "__transaction_state")
    return parts[partition_for(TXN_ID, len(parts))].leader


def leader_of(cluster: ClusterProcesses, partition: int) -> int:
    return partitions_of(metadata(cluster.bootstrap_of(*cluster.alive()), SINK), SINK)[partition].leader


def committed_offsets(bootstrap: str, group: str = GROUP, isolation: str = "read_committed") -> dict[int, int]:
    """The group's committed offsets of SOURCE. read_committed (librdkafka's default) asks for
    stable offsets only (OffsetFetch v7, KIP-447): while a transaction holds an offset of
    the group the broker answers UNSTABLE_OFFSET_COMMIT and librdkafka asks again."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": isolation, "log_level": 2})
    try:
        return {tp.partition: tp.offset
                for tp in c.committed([TopicPartition(SOURCE, p) for p in range(PARTITIONS)], timeout=10)}
    finally:
        c.close()


def stall_report(cluster: ClusterProcesses, app: Application) -> str:
    """What the application and the coordinator were doing when output stopped: the
    application's last lines and the coordinator's view of its transaction."""
    lines = [ln for ln in app.text().splitlines() if "in transaction" not in ln][-25:]
    try:
        described = transactions_cli(cluster, "describe", "--transactional-id", TXN_ID)
    except (AssertionError, subprocess.TimeoutExpired) as exc:
        described = f"(describe failed: {exc})"
    return ("application log (tail, 'in transaction' lines left out):\n" + "\n".join(lines)
            + f"\napplication exits so far: {app.exits}\ncoordinator's view:\n{described}")


def create_topics(cluster: ClusterProcesses) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for name, fut in admin.create_topics([NewTopic(t, PARTITIONS, RF, config={"min.insync.replicas": "2"})
                                          for t in (SOURCE, SINK)]).items():
        fut.result(30)
        wait_fully_replicated(cluster, name, PARTITIONS, RF)


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_consume_transform_produce_exactly_once_through_kills(cluster_factory: Any, tmp_path: Path) -> None:
    rng = fault_rng("consume-transform-produce")
    # 6 s, not 3: with a Spark test beside it on 2 cores the controller answers heartbeats late
    # (2 s timeouts), and at 3 s live brokers were fenced over and over, their replicas
    # ineligible for the ISR (CI, "not whole within 90 s").
    cluster: ClusterProcesses = cluster_factory(3, **{"broker.session.timeout.ms": 6000})
    create_topics(cluster)
    workload = ProducerWorkload(cluster.bootstrap, SOURCE, PARTITIONS, rate_per_s=250).start()
    app = Application(cluster.bootstrap, tmp_path).start()
    watch = StableOffsetWatch(cluster.bootstrap).start()
    try:
        wait_until(lambda: watch.total >= 300, 90, "the application's first committed output", cluster)
        wait_fully_replicated(cluster, "__transaction_state", 50, RF, timeout_s=90)
        schedule = ["coordinator", "leader", "app"] * 2
        rng.shuffle(schedule)
        for n, kind in enumerate(schedule, 1):
            time.sleep(rng.uniform(0.5, 3.0))
            progress = watch.total
            if kind == "app":
                app.kill9_in_transaction()
                print(f"fault {n}: killed the application inside a transaction", flush=True)
            else:
                victim = coordinator_of(cluster) if kind == "coordinator" else leader_of(
                    cluster, rng.randrange(PARTITIONS))
                cluster[victim].kill9()
                print(f"fault {n}: killed broker {victim} ({kind})", flush=True)
                time.sleep(rng.uniform(0.5, 3.0))
                cluster[victim].restart()
                for topic, count in ((SOURCE, PARTITIONS), (SINK, PARTITIONS), ("__transaction_state", 50)):
                    wait_fully_replicated(cluster, topic, count, RF, timeout_s=90)
            try:
                wait_until(lambda progress=progress: watch.total >= progress + 200, 120,
                           f"output committed again after fault {n} ({kind})", cluster)
            except AssertionError as stalled:
                raise AssertionError(f"{stall_report(cluster, app)}\n{stalled}") from None
        result = workload.stop()
        assert len(result.acked) == result.sent, f"input delivery errors: {dict(result.errors)}"
        source = read_partitions(cluster.bootstrap, SOURCE, "read_committed")
        ends = {p: (rows[-1][0] + 1 if rows else 0) for p, rows in source.items()}
        try:
            wait_until(lambda: committed_offsets(cluster.bootstrap) == ends, 300,
                       f"the group's committed offsets at the input's ends {ends}", cluster)
        except AssertionError as stalled:
            raise AssertionError(f"{stall_report(cluster, app)}\n{stalled}") from None
    finally:
        code = app.finish()
        watch.stop()
        print(f"application exits before the end: {app.exits}; final exit {code}")
        print("application log (tail):\n" + "\n".join([ln for ln in app.text().splitlines() if "in transaction" not in ln][-30:]))

    output = read_partitions(cluster.bootstrap, SINK, "read_committed")
    everything = read_partitions(cluster.bootstrap, SINK, "read_uncommitted")
    inputs = {(p, off): value for p, rows in source.items() for off, _, value in rows}
    copies = Counter(key for rows in output.values() for _, key, _ in rows)
    duplicated = {k: n for k, n in copies.items() if n > 1}
    missing = [k for k in inputs if b"%d:%d" % k not in copies]
    strangers = [k for k in copies if tuple(map(int, (k or b"x:x").split(b":"))) not in inputs]
    wrong_value = [(p, key) for p, rows in output.items() for _, key, value in rows
                   if key in copies and inputs.get(tuple(map(int, key.split(b":")))) != value]
    out_of_order = [p for p, rows in output.items()
                    if [int(key.split(b":")[1]) for _, key, _ in rows] != sorted(int(k.split(b":")[1]) for _, k, _ in rows)]
    print(f"input {len(inputs)} records; output read_committed {sum(map(len, output.values()))}, "
          f"read_uncommitted {sum(map(len, everything.values()))} (the difference is aborted data); "
          f"{watch.answers} ListOffsets answers watched, app exits {app.exits}")
    assert not watch.regressions, f"last stable offset moved back: {watch.regressions[:5]}"
    assert not duplicated, f"{len(duplicated)} input records twice in the output, e.g. {list(duplicated.items())[:5]}"
    assert not missing, f"{len(missing)} input records missing from the output, e.g. {missing[:5]}"
    assert not strangers and not wrong_value, f"records no input produced: {strangers[:5]} {wrong_value[:5]}"
    assert not out_of_order, f"output out of input order in partitions {out_of_order}"
    committed_n, all_n = sum(map(len, output.values())), sum(map(len, everything.values()))
    assert all_n > committed_n, "no aborted records in the output log, though the application died inside transactions"
    assert all(any(k.startswith(b"%d:" % p) for k in copies) for p in range(PARTITIONS))
    assert code == 0, "the application did not stop cleanly at the end"


def stable_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)},
                                 isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=10)
    return {tp.partition: fut.result().offset for tp, fut in futures.items()}


def transactions_cli(cluster: ClusterProcesses, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "deploy.cli", "transactions", *args, "--bootstrap",
                          cluster.bootstrap], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.timeout(400)
@pytest.mark.parametrize("how", ["kill-9", "clean"])
def test_transactions_survive_a_full_cluster_restart(cluster_factory: Any, how: str) -> None:
    """Every broker of a 3-broker RF 3 cluster down at once (SIGKILL, or a clean stop) with
    a committed, an aborted and an open transaction (records in every partition, offsets sent
    to it): afterwards the last stable offsets are where they were, the coordinator still
    knows the open transaction and the group's offset is still pending; the same producer
    then commits it, and its records and its offset become visible exactly once."""
    cluster: ClusterProcesses = cluster_factory(3)
    create_topics(cluster)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "restart-app",
                  "transaction.timeout.ms": 300_000, "message.timeout.ms": 120_000, "log_level": 2})
    p.init_transactions(60)
    group = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "restart-group", "log_level": 2})
    committed = [b"c%d" % i for i in range(9)]
    for kind, values in (("commit", committed), ("abort", [b"a%d" % i for i in range(6)]),
                         ("open", [b"o%d" % i for i in range(12)])):
        p.begin_transaction()
        for i, v in enumerate(values):
            p.produce(SINK, value=v, partition=i % PARTITIONS)
        p.flush(30)
        if kind == "commit":
            p.commit_transaction(60)
        elif kind == "abort":
            p.abort_transaction(60)
    p.send_offsets_to_transaction([TopicPartition(SOURCE, 0, 42)], group.consumer_group_metadata(), 60)
    # 3 committed + marker, 2 aborted + marker per partition: the open transaction starts at 7.
    wait_until(lambda: stable_offsets(cluster.bootstrap, SINK) == {q: 7 for q in range(PARTITIONS)}, 30,
               "the last stable offsets at the open transaction", cluster)
    assert "Ongoing" in transactions_cli(cluster, "describe", "--transactional-id", "restart-app")

    for node in cluster.brokers.values():
        node.kill9() if how == "kill-9" else node.stop()
    print(f"every broker down ({how})", flush=True)
    cluster.start(timeout_s=90)
    for topic, count in ((SOURCE, PARTITIONS), (SINK, PARTITIONS), ("__transaction_state", 50)):
        wait_fully_replicated(cluster, topic, count, RF, timeout_s=120)

    assert stable_offsets(cluster.bootstrap, SINK) == {q: 7 for q in range(PARTITIONS)}
    described = transactions_cli(cluster, "describe", "--transactional-id", "restart-app")
    assert "Ongoing" in described and all(f"{SINK}-{q}" in described for q in range(PARTITIONS)), described
    assert all(v in committed for rows in read_partitions(cluster.bootstrap, SINK, "read_committed").values()
               for _, _, v in rows)
    # (read_uncommitted: a read_committed consumer would be told to wait for the transaction)
    assert committed_offsets(cluster.bootstrap, "restart-group", "read_uncommitted")[0] < 0, \
        "the open transaction's offset is visible"

    p.commit_transaction(120)  # the same producer instance, across the outage
    wait_until(lambda: stable_offsets(cluster.bootstrap, SINK) == {q: 12 for q in range(PARTITIONS)}, 30,
               "the commit markers", cluster)
    after = read_partitions(cluster.bootstrap, SINK, "read_committed")
    assert {q: [v for _, _, v in rows] for q, rows in after.items()} == {
        q: committed[q::PARTITIONS] + [b"o%d" % i for i in range(12)][q::PARTITIONS] for q in range(PARTITIONS)}
    assert committed_offsets(cluster.bootstrap, "restart-group")[0] == 42
    group.close()


@pytest.mark.timeout(240)
def test_a_timed_out_transaction_whose_abort_cannot_be_written_is_retried_at_the_cleanup_interval(
        cluster_factory: Any) -> None:
    """A transaction times out while its coordinator cannot write to `__transaction_state`
    (min.insync.replicas 3, a broker down): the abort is tried again every cleanup interval
    (transaction.abort.timed.out.transaction.cleanup.interval.ms), as Kafka's cleanup task
    does, and written once the broker is back. It was tried again at once, in a loop as fast
    as the write failed: hundreds of attempts a second, a broker too busy for its heartbeats
    (seen in the Kafka Streams fault test of tests/kafka/test_java_clients.py)."""
    from datetime import datetime

    txn_id, interval_ms = "slow-app", 1000
    cluster: ClusterProcesses = cluster_factory(3, **{
        "transaction.state.log.min.isr": 3, "broker.session.timeout.ms": 6000,
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": interval_ms})
    create_topics(cluster)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id,
                  "transaction.timeout.ms": 3000, "log_level": 2})
    p.init_transactions(60)
    wait_fully_replicated(cluster, "__transaction_state", 50, RF, timeout_s=90)
    p.begin_transaction()
    p.produce(SINK, value=b"never-committed", partition=0)
    assert p.flush(30) == 0
    parts = partitions_of(metadata(cluster.bootstrap, "__transaction_state"), "__transaction_state")
    coordinator = parts[partition_for(txn_id, len(parts))].leader
    victim = next(b for b in cluster.brokers if b != coordinator)
    mark = len(cluster[coordinator].log_text())
    cluster[victim].kill9()
    failed = f"writing the state of transactional id {txn_id} "

    def attempts() -> list[float]:
        lines = [ln for ln in cluster[coordinator].log_text()[mark:].splitlines() if failed in ln]
        if len(lines) < 4:
            raise NotYet(f"{len(lines)} failed attempts to abort so far")
        return [datetime.strptime(ln[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() for ln in lines]

    times = wait_until(attempts, 90, f"four failed attempts to abort the timed-out transaction of {txn_id}", cluster)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    print(f"broker {victim} down; coordinator {coordinator} tried the abort at intervals of {gaps} s")
    # The first attempts may wait out acks=all until the victim is fenced; after that each
    # fails at once, and the next waits for the cleanup interval.
    assert min(gaps) >= 0.8 * interval_ms / 1000, f"abort attempts {gaps} s apart"
    cluster[victim].restart()
    wait_until(lambda: stable_offsets(cluster.bootstrap, SINK)[0] == 2, 90,
               "the abort marker after the record (last stable offset 2)", cluster)
