"""Kafka's Java clients (4.x, `make peers`) against dcmirror (issue 30).

The clients run in a small driver, tests/kafka/java/JavaClients.java (a mode per run, JSON
lines out) and StreamsCount.java (a Kafka Streams application), compiled once per module
with javac against the pinned jars. What they wrote is read back with librdkafka
(confluent-kafka), never with the client under test.

- the idempotent producer (acks=all): every record acknowledged once, at the offset it is
  read back at; the transactional producer: commit, abort, offsets sent to a transaction,
  fencing by a second producer (compared with Kafka);
- the consumer, classic protocol and KIP-848 (`group.protocol=consumer`): two members split
  a topic, every record consumed once, the commits in place;
- the Admin client, call by call against dcmirror and against a real Kafka, the answers
  compared field by field (KNOWN_DIFFERENCES says where they differ and why);
- Kafka Streams with exactly_once_v2 on a 3-broker cluster while brokers (and once the
  application) are killed with SIGKILL in a seeded order (replay: DCMIRROR_FAULT_SEED=N):
  every input's result in the output exactly once. It found three broker bugs: OffsetFetch
  without require_stable (Streams refused to run), a timed-out transaction's abort retried
  in a hot loop while it could not be written, and PRODUCER_FENCED where Kafka answers a
  produce INVALID_PRODUCER_EPOCH.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from cluster.groups.records import partition_for
from tests.cluster_helpers import NotYet, create_topic, metadata, partitions_of, wait_until
from tests.fault_workload import fault_rng, wait_fully_replicated
from tests.harness import REPO, BrokerProcess, ClusterProcesses, free_port
from tests.ops.common import scrape
from tests.ops.common import value as sample
from tests.peers.fetch import classpath
from tests.peers.kafka import KafkaCluster, java, run_tool, tool_log_config

JAVA_SOURCES = Path(__file__).with_name("java")
DRIVER_JVM = ("-Xss1m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")
STREAMS_JVM = ("-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")

pytestmark = pytest.mark.timeout(300)


# --------------------------------------------------------------------------- the Java driver


class JavaDriver:
    """The compiled driver classes: `run` a JavaClients mode to completion; `command` for a
    long-running main (StreamsCount)."""

    def __init__(self, classes: Path) -> None:
        self.classes = classes

    def command(self, main: str, mode: str | None, jvm: tuple[str, ...], **args: object) -> list[str]:
        return [java(), *jvm, f"-Dlog4j2.configurationFile={tool_log_config(self.classes)}",
                "-cp", f"{self.classes}{os.pathsep}{classpath('kafka')}", main,
                *([mode] if mode else []), *(f"{k}={v}" for k, v in args.items())]

    def run(self, mode: str, timeout_s: float = 120.0, **args: object) -> list[dict[str, Any]]:
        """JavaClients <mode> key=value...: its JSON lines (AssertionError with stderr if it fails)."""
        proc = subprocess.run(self.command("JavaClients", mode, DRIVER_JVM, **args), capture_output=True,
                              text=True, timeout=timeout_s)
        assert proc.returncode == 0, f"JavaClients {mode} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
        return [orjson.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> JavaDriver:
    """tests/kafka/java/*.java compiled against the pinned Kafka jars, once per module."""
    return compile_driver(tmp_path_factory.mktemp("java-classes"))


def compile_driver(classes: Path) -> JavaDriver:
    """tests/kafka/java/*.java compiled into `classes` (also the scale benchmark's Java row)."""
    javac = shutil.which("javac")
    assert javac is not None, "no javac on the PATH: `make sysdeps` installs the JDK"
    proc = subprocess.run([javac, "-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC", "-nowarn",
                           "-d", str(classes), "-cp", classpath("kafka"), *map(str, sorted(JAVA_SOURCES.glob("*.java")))],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"javac failed:\n{proc.stdout}\n{proc.stderr}"
    return JavaDriver(classes)


# --------------------------------------------------------------------------- reading back (librdkafka)


Row = tuple[int, bytes | None, bytes | None]  # offset, key, value


def read_partitions(bootstrap: str, topic: str, partitions: int, isolation: str = "read_committed",
                    timeout_s: float = 60.0) -> dict[int, list[Row]]:
    """Every record of every partition from the log start to the end a fresh consumer sees
    (the high watermark, or the last stable offset for read_committed)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex[:8]}",
                  "isolation.level": isolation, "enable.auto.commit": False, "enable.partition.eof": True,
                  "auto.offset.reset": "earliest", "log_level": 2})
    try:
        c.assign([TopicPartition(topic, p, -2) for p in range(partitions)])  # OFFSET_BEGINNING
        out: dict[int, list[Row]] = {p: [] for p in range(partitions)}
        done: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(done) < partitions:
            assert time.monotonic() < deadline, f"read {sum(map(len, out.values()))} records of {topic}, " \
                                                f"partitions {sorted(done)} at their end"
            for m in c.consume(10_000, timeout=1.0):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition())
                        continue
                    raise AssertionError(f"consumer error: {m.error()}")
                done.discard(m.partition())
                out[m.partition()].append((m.offset(), m.key(), m.value()))
        return out
    finally:
        c.close()


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 2})
    try:
        return {tp.partition: tp.offset
                for tp in c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)}
    finally:
        c.close()


# --------------------------------------------------------------------------- producer


def test_idempotent_producer_every_record_acknowledged_once_at_its_offset(
        driver: JavaDriver, dcmirror_broker: BrokerProcess) -> None:
    """enable.idempotence=true, acks=all, 5 requests in flight per connection, small lz4
    batches: each record's callback runs once, without error, and the record is at the
    acknowledged offset when read back, exactly once, in send order per partition."""
    topic, count, partitions = "java-idempotent", 5000, 3
    create_topic(dcmirror_broker.bootstrap, topic, partitions, 1)
    (result,) = driver.run("idempotent", bootstrap=dcmirror_broker.bootstrap, topic=topic, count=count,
                           partitions=partitions, compression="lz4")
    assert result["errors"] == {} and result["callbacks"] == count
    acked = {i: (p, off) for i, p, off in result["acks"]}
    assert len(acked) == len(result["acks"]) == count, "a record acknowledged twice"
    back = read_partitions(dcmirror_broker.bootstrap, topic, partitions, "read_uncommitted")
    found = {int(v[1:]): (p, off) for p, rows in back.items() for off, _, v in rows if v is not None}
    assert sum(map(len, back.values())) == count, "records read back more than once or extra records"
    assert found == acked
    for p, rows in back.items():
        assert [off for off, _, _ in rows] == list(range(len(rows))), f"partition {p} has gaps"
        assert [int(v[1:]) for _, _, v in rows if v] == list(range(p, count, partitions))


# --------------------------------------------------------------------------- consumer


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_consumer_group_two_members_split_the_topic(driver: JavaDriver, dcmirror_broker: BrokerProcess,
                                                    protocol: str) -> None:
    """Two Java consumers of one group (classic, or KIP-848 with the broker's assignor) share
    a 4-partition topic: each owns two partitions, every record is consumed once, and the
    group's committed offsets end at the partitions' ends."""
    topic, partitions, count, group = f"java-group-{protocol}", 4, 2000, f"java-group-{protocol}"
    bootstrap = dcmirror_broker.bootstrap
    create_topic(bootstrap, topic, partitions, 1)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "log_level": 2})
    for i in range(count):
        p.produce(topic, value=b"v%d" % i, partition=i % partitions)
    assert p.flush(30) == 0
    members = driver.run("group", bootstrap=bootstrap, topic=topic, group=group, protocol=protocol,
                         count=count, partitions=partitions)
    assert len(members) == 2 and not [m["error"] for m in members if "error" in m], members
    assignments = [set(m["assignment"]) for m in members]
    assert all(len(a) == 2 for a in assignments) and assignments[0] | assignments[1] == set(range(partitions))
    seen = Counter((p, off) for m in members for p, off, _ in m["records"])
    assert len(seen) == count and max(seen.values()) == 1, "a record consumed twice or not at all"
    for m in members:
        assert {p for p, _, _ in m["records"]} == set(m["assignment"]), "records from a partition not owned"
    ends = {q: count // partitions for q in range(partitions)}
    assert {int(q): off for m in members for q, off in m["committed"].items()} == ends
    assert committed_offsets(bootstrap, group, topic, partitions) == ends


# --------------------------------------------------------------------------- fetch sessions (KIP-227)


def test_java_consumer_fetch_session_follows_partitions_added_and_removed(driver: JavaDriver,
                                                                          tmp_path: Path) -> None:
    """The Java consumer opens an incremental fetch session (KIP-227) and keeps it while its
    partitions change: 120 partitions of one topic read from the start, 40 of another added,
    all but 30 of the first removed, then late records to every partition of the first: it
    reads every record once, the late ones of the partitions it kept and none of the others,
    and its fetches were incremental, naming a few partitions each, not all of them."""
    http = free_port()
    broker = BrokerProcess(tmp_path / "broker", admin_http_listener=f"127.0.0.1:{http}").start()
    try:
        first, second, keep, late = ("sessions-a", 120), ("sessions-b", 40), 30, 600
        bootstrap = broker.bootstrap
        expected: dict[str, dict[int, list[int]]] = {}
        for (topic, partitions), count in ((first, 1200), (second, 400)):
            create_topic(bootstrap, topic, partitions, 1)
            p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 2})
            for i in range(count):
                p.produce(topic, value=b"v%d" % i, partition=i % partitions)
            assert p.flush(30) == 0
            expected[topic] = {q: list(range(q, count, partitions)) for q in range(partitions)}
        before = scrape(f"http://127.0.0.1:{http}")
        phases = driver.run("sessions", bootstrap=bootstrap, first=first[0], first_partitions=first[1],
                            first_count=1200, second=second[0], second_partitions=second[1], second_count=400,
                            keep=keep, late=late)
        after = scrape(f"http://127.0.0.1:{http}")
    finally:
        broker.stop()
    records = {ph["phase"]: ph["records"] for ph in phases}

    def by_partition(rows: list[list[int]]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = defaultdict(list)
        for partition, _offset, n in rows:
            out[partition].append(n)
        return dict(out)

    assert by_partition(records[1]) == expected[first[0]]
    assert by_partition(records[2]) == expected[second[0]], "the added topic's records, once each, in order"
    late_kept = {q: list(range(q, late, first[1])) for q in range(keep)}
    assert by_partition(records[3]) == late_kept, "late records: all of the kept partitions, none of the removed"
    assert all(off >= 10 for _p, off, _n in records[3]), "late records are at offsets after the first 1,200"

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    incremental = delta("dcmirror_broker_fetch_requests_total", fetcher="consumer", session="incremental")
    listed = delta("dcmirror_broker_fetch_partitions_listed_total", fetcher="consumer", session="incremental")
    full = delta("dcmirror_broker_fetch_requests_total", fetcher="consumer", session="full")
    sessionless = delta("dcmirror_broker_fetch_requests_total", fetcher="consumer", session="none")
    print(f"consumer fetches: {full:.0f} full, {incremental:.0f} incremental listing {listed:.0f} partitions, "
          f"{sessionless:.0f} sessionless")
    # The one sessionless fetch (if any) is the consumer's close of its session: it names nothing.
    assert sessionless <= 1 and delta("dcmirror_broker_fetch_partitions_listed_total", fetcher="consumer",
                                      session="none") == 0
    assert full >= 1 and incremental >= 20
    # A sessionless consumer names all 120-160 partitions in every fetch; in its session one
    # names those whose position moved (all of them while each has records, none when idle).
    assert listed / incremental < 15, (listed, incremental)


# --------------------------------------------------------------------------- Kafka Streams, exactly_once_v2


STREAMS_IN, STREAMS_OUT, STREAMS_PARTITIONS, STREAMS_KEYS, STREAMS_APP = "streams-in", "streams-out", 4, 24, "counts"
INTERNAL_PARTITIONS = 10


class KeyedInput:
    """librdkafka idempotent acks=all producer in a thread: value i (i = 0, 1, ...) with key
    k<i % keys>, paced; acknowledged (key, value) pairs kept."""

    def __init__(self, bootstrap: str, rate_per_s: float) -> None:
        self.rate_per_s = rate_per_s
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 5, "message.timeout.ms": 120_000, "request.timeout.ms": 10_000,
                                  "socket.connection.setup.timeout.ms": 3000, "reconnect.backoff.max.ms": 500,
                                  "topic.metadata.refresh.interval.ms": 1000, "log_level": 2})
        self.sent = 0
        self.acked = 0
        self.errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="streams-input", daemon=True)

    def _delivered(self, err: KafkaError | None, _msg: Any) -> None:
        with self._lock:
            if err is None:
                self.acked += 1
            else:
                self.errors[err.name()] += 1

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - start) * self.rate_per_s)
            while self.sent < due and not self._stop.is_set():
                i = self.sent
                try:
                    self.producer.produce(STREAMS_IN, key=b"k%d" % (i % STREAMS_KEYS), value=b"%d" % i,
                                          on_delivery=self._delivered)
                except BufferError:
                    self.producer.poll(0.05)
                    continue
                self.sent += 1
            self.producer.poll(0.01)

    def start(self) -> KeyedInput:
        self._thread.start()
        return self

    def stop(self, flush_timeout_s: float = 150.0) -> None:
        self._stop.set()
        self._thread.join()
        left = self.producer.flush(flush_timeout_s)
        assert left == 0, f"{left} input records unacknowledged after {flush_timeout_s:.0f} s"
        assert self.acked == self.sent, f"input delivery errors: {dict(self.errors)}"


class OutputWatch:
    """A read_committed librdkafka consumer of the whole output topic in a thread: how many
    committed output records there are so far (the application's progress)."""

    def __init__(self, bootstrap: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"watch-{uuid.uuid4().hex[:8]}",
                                  "isolation.level": "read_committed", "enable.auto.commit": False,
                                  "topic.metadata.refresh.interval.ms": 1000, "log_level": 2})
        self.consumer.assign([TopicPartition(STREAMS_OUT, p, -2) for p in range(STREAMS_PARTITIONS)])
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="streams-output", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self.consumer.consume(1000, timeout=0.2):
                if not m.error():
                    self.count += 1

    def start(self) -> OutputWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.consumer.close()


class StreamsApp:
    """StreamsCount in its own JVM (started again after a kill -9 on the same state
    directory); its JSON lines (state changes, replaced threads) appended to one file."""

    def __init__(self, driver: JavaDriver, bootstrap: str, workdir: Path) -> None:
        self.stop_file = workdir / "streams.stop"
        self.out_path, self.err_path = workdir / "streams.jsonl", workdir / "streams.log"
        self.cmd = driver.command("StreamsCount", None, STREAMS_JVM, bootstrap=bootstrap, input=STREAMS_IN,
                                  output=STREAMS_OUT, app=STREAMS_APP, state=workdir / "state", stop=self.stop_file)
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.out_path, "ab") as out, open(self.err_path, "ab") as err:
            return subprocess.Popen(self.cmd, stdout=out, stderr=err)

    def kill9_and_restart(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc = self._spawn()

    def events(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.out_path.read_bytes().splitlines() if line.startswith(b"{")]

    def alive(self) -> bool:
        """True while the JVM runs (AssertionError with its output once it exited)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"Kafka Streams exited with {self.proc.returncode}: {self.events()[-5:]}\n"
                                 f"{self.err_path.read_text(errors='replace')[-3000:]}")
        return True

    def finish(self, timeout_s: float = 60.0) -> dict[str, Any]:
        self.stop_file.touch()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"Kafka Streams did not close within {timeout_s:.0f} s of the stop file") from None
        closed = [e for e in self.events() if "closed" in e]
        assert closed, f"Kafka Streams exited {self.proc.returncode} without closing: {self.events()[-5:]}"
        return closed[-1]

    def log_tail(self) -> str:
        lines = self.err_path.read_text(errors="replace").splitlines()
        return "\n".join([str(e) for e in self.events()[-10:]] + lines[-40:])


def streams_transactional_ids(cluster: ClusterProcesses) -> dict[str, int]:
    """The application's transactional ids with a transaction open (exactly_once_v2: one per
    stream thread) and their coordinators, from `dcmirror transactions list`."""
    out = subprocess.run([sys.executable, "-m", "deploy.cli", "transactions", "list", "--bootstrap",
                          cluster.bootstrap_of(*cluster.alive())], cwd=REPO, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise NotYet(out.stderr.strip()[-300:])
    ids = {line.split()[0]: int(line.split()[1]) for line in out.stdout.splitlines()[1:]
           if line.startswith(f"{STREAMS_APP}-") and line.split()[-1] == "Ongoing"}
    if not ids:
        raise NotYet("no open transaction of the application listed yet")
    return ids


def leader_of(cluster: ClusterProcesses, topic: str, partition: int) -> int:
    return partitions_of(metadata(cluster.bootstrap_of(*cluster.alive()), topic), topic)[partition].leader


def group_coordinator_of(cluster: ClusterProcesses, group: str) -> int:
    parts = partitions_of(metadata(cluster.bootstrap_of(*cluster.alive()), "__consumer_offsets"),
                          "__consumer_offsets")
    return parts[partition_for(group, len(parts))].leader


@pytest.mark.slow
@pytest.mark.heavy  # never beside another heavy test (tests/conftest.py)
@pytest.mark.timeout(900)
def test_kafka_streams_exactly_once_v2_through_broker_kills(driver: JavaDriver, cluster_factory: Any,
                                                            tmp_path: Path) -> None:
    """A Kafka Streams application (exactly_once_v2, a state store per key, two stream
    threads) on a 3-broker RF 3 cluster while input is produced and brokers are killed with
    SIGKILL in a seeded order: the transaction coordinator of one of its producers, the
    coordinator of its consumer group, partition leaders; the application itself once
    (started again on its state directory). At the end, for each key the output
    (read_committed) is "1:v1", "2:v2", ... "N:vN" with v1..vN the key's input values in
    input order: every input's result exactly once, each from the state before it."""
    rng = fault_rng("kafka-streams-exactly-once")
    # 10 partitions of each internal topic, not 50: a busy 2-core machine moves fewer
    # coordinators each time a broker comes and goes.
    cluster: ClusterProcesses = cluster_factory(3, **{
        "broker.session.timeout.ms": 6000, "offsets.topic.num.partitions": INTERNAL_PARTITIONS,
        "transaction.state.log.num.partitions": INTERNAL_PARTITIONS})
    for topic in (STREAMS_IN, STREAMS_OUT):
        create_topic(cluster.bootstrap, topic, STREAMS_PARTITIONS, 3, config={"min.insync.replicas": "2"})
        wait_fully_replicated(cluster, topic, STREAMS_PARTITIONS, 3)
    source = KeyedInput(cluster.bootstrap, rate_per_s=120).start()
    app = StreamsApp(driver, cluster.bootstrap, tmp_path)
    watch = OutputWatch(cluster.bootstrap).start()
    try:
        wait_until(lambda: app.alive() and watch.count >= 300, 120, "the application's first committed output", cluster)
        schedule = ["txn-coordinator", "group-coordinator", "leader", "leader", "application"]
        rng.shuffle(schedule)
        for n, kind in enumerate(schedule, 1):
            time.sleep(rng.uniform(0.5, 3.0))
            progress = watch.count
            if kind == "application":
                # Its open transactions are aborted by their coordinators (timeout), its
                # offsets stay unstable until then, its state is restored from the changelog.
                app.kill9_and_restart()
                print(f"fault {n}: killed Kafka Streams at {progress} output records", flush=True)
                victim = None
            elif kind == "txn-coordinator":
                ids = wait_until(lambda: streams_transactional_ids(cluster), 30, "the application's producers")
                victim = ids[sorted(ids)[rng.randrange(len(ids))]]
            elif kind == "group-coordinator":
                victim = group_coordinator_of(cluster, STREAMS_APP)
            else:
                victim = leader_of(cluster, rng.choice((STREAMS_IN, STREAMS_OUT)), rng.randrange(STREAMS_PARTITIONS))
            if victim is not None:
                cluster[victim].kill9()
                print(f"fault {n}: killed broker {victim} ({kind}) at {progress} output records", flush=True)
                time.sleep(rng.uniform(0.5, 3.0))
                cluster[victim].restart()
            for topic, count in ((STREAMS_IN, STREAMS_PARTITIONS), (STREAMS_OUT, STREAMS_PARTITIONS),
                                 ("__transaction_state", INTERNAL_PARTITIONS),
                                 ("__consumer_offsets", INTERNAL_PARTITIONS)):
                wait_fully_replicated(cluster, topic, count, 3, timeout_s=90)
            try:
                wait_until(lambda progress=progress: app.alive() and watch.count >= progress + 300, 120,
                           f"committed output growing again after fault {n} ({kind})", cluster)
            except AssertionError as stalled:
                raise AssertionError(f"Kafka Streams:\n{app.log_tail()}\n{stalled}") from None
        source.stop()
        try:
            wait_until(lambda: app.alive() and watch.count >= source.acked, 120,
                       f"an output record for each of the {source.acked} input records", cluster)
        except AssertionError as stalled:
            raise AssertionError(f"Kafka Streams:\n{app.log_tail()}\n{stalled}") from None
        closed = app.finish()
    finally:
        watch.stop()
        if app.proc.poll() is None:
            app.proc.kill()

    inputs = read_partitions(cluster.bootstrap, STREAMS_IN, STREAMS_PARTITIONS, "read_committed")
    outputs = read_partitions(cluster.bootstrap, STREAMS_OUT, STREAMS_PARTITIONS, "read_committed")
    everything = read_partitions(cluster.bootstrap, STREAMS_OUT, STREAMS_PARTITIONS, "read_uncommitted")
    by_key_in: dict[bytes, list[bytes]] = defaultdict(list)
    for rows in inputs.values():
        for _, key, value in rows:
            assert key is not None and value is not None
            by_key_in[key].append(value)
    by_key_out: dict[bytes, list[bytes]] = defaultdict(list)
    for rows in outputs.values():
        for _, key, value in rows:
            assert key is not None and value is not None
            by_key_out[key].append(value)
    n_in, n_out = sum(map(len, by_key_in.values())), sum(map(len, by_key_out.values()))
    print(f"input {n_in} records ({source.sent} sent), output read_committed {n_out}, read_uncommitted "
          f"{sum(map(len, everything.values()))} (the difference is aborted output); Kafka Streams: {closed}, "
          f"states {[e['state'] for e in app.events() if 'state' in e]}")
    assert n_in == source.sent
    wrong = {}
    for key, values in by_key_in.items():
        expected = [b"%d:%s" % (i, v) for i, v in enumerate(values, 1)]
        if by_key_out.get(key) != expected:
            got = by_key_out.get(key, [])
            first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                         min(len(got), len(expected)))
            wrong[key] = (f"{len(got)} outputs for {len(expected)} inputs; first difference at {first}: "
                          f"{got[first:first + 3]} for {expected[first:first + 3]}")
    assert not wrong, f"{len(wrong)} keys without exactly one result per input: {dict(list(wrong.items())[:5])}"
    assert set(by_key_out) <= set(by_key_in), "output for keys no input had"
    assert closed["threads_replaced"] == 0, f"stream threads died: {[e for e in app.events() if 'thread_died' in e]}"


# --------------------------------------------------------------------------- beside Kafka
# (last in the module: the Kafka JVM the `kafka` fixture starts then never runs beside the
# Streams fault test)


def test_transactional_producer_commit_abort_and_fencing(driver: JavaDriver, dcmirror_broker: BrokerProcess,
                                                         kafka: KafkaCluster) -> None:
    """Commit, abort, offsets sent to a transaction, then a second producer with the same
    transactional id fences the first in the middle of a transaction: what the Java producer
    sees is what it sees against Kafka, and read_committed shows only committed records."""
    topic, partitions, group = "java-txn", 3, "java-txn-group"
    answers = {}
    for name, bootstrap in (("dcmirror", dcmirror_broker.bootstrap), ("kafka", kafka.bootstrap)):
        create_topic(bootstrap, topic, partitions, 1)
        first, fencing = driver.run("transactional", bootstrap=bootstrap, topic=topic, partitions=partitions,
                                    txn=f"java-txn-{name}", group=group)
        answers[name] = (first, fencing)
        committed = read_partitions(bootstrap, topic, partitions, "read_committed")
        everything = read_partitions(bootstrap, topic, partitions, "read_uncommitted")
        values = sorted(v.decode() for rows in committed.values() for _, _, v in rows if v)
        assert values == sorted([f"c{i}" for i in range(6)] + [f"o{i}" for i in range(6)]
                                + [f"s{i}" for i in range(3)]), name
        assert len([v for rows in everything.values() for _, _, v in rows if v and v.startswith(b"a")]) == 6
        by_offset = {(p, off): v.decode() for p, rows in everything.items() for off, _, v in rows if v}
        for kind, prefix in (("committed", "c"), ("aborted", "a"), ("with_offsets", "o")):
            for i, p, off in first[kind]:
                assert by_offset[(p, off)] == f"{prefix}{i}", (name, kind, i)
        assert committed_offsets(bootstrap, group, topic, partitions)[0] == 42, name
    assert answers["dcmirror"] == answers["kafka"]


# call.path (fnmatch pattern over the flattened answers) -> why dcmirror answers otherwise.
# Each must still differ (a fixed one must leave the table), and nothing else may.
KNOWN_DIFFERENCES: dict[str, str] = {
    "configs.broker._count": "a broker describes every config Kafka 4.3.1 has (340) and dcmirror's own beside "
                             "them (admin HTTP, mirror, quorum settings)",
    "configs.*ed._count": "a topic describes three Kafka 3 configs Kafka 4.0 removed (message.format.version, "
                          "message.downconversion.enable, message.timestamp.difference.max.ms): dcmirror still "
                          "takes them, so 3.x topic configs and tools keep working (as test_differential.py)",
}


def flatten(value: Any, path: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay whole."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{path}.{k}" if path else str(k)))
        return out
    return {path: value}


def test_admin_client_answers_as_kafka(driver: JavaDriver, dcmirror_broker: BrokerProcess,
                                       kafka: KafkaCluster) -> None:
    """The Java Admin client's calls, one sequence run against dcmirror and against Kafka
    (JavaClients admin: createTopics with configs and bad arguments, describeTopics,
    describeCluster, listOffsets by spec and time, describeConfigs and
    incrementalAlterConfigs, describeConsumerGroups of a classic and a KIP-848 group while
    a member runs and after it left, listConsumerGroupOffsets, deleteRecords), every answer
    normalized (no ids, ports, times) and compared field by field."""
    answers = {}
    for name, bootstrap in (("kafka", kafka.bootstrap), ("dcmirror", dcmirror_broker.bootstrap)):
        answers[name] = flatten({line["call"]: line["result"] for line in
                                 driver.run("admin", timeout_s=180, bootstrap=bootstrap, prefix="java-admin")})
    ours, theirs = answers["dcmirror"], answers["kafka"]
    differ = {path for path in ours.keys() | theirs.keys() if ours.get(path, "<absent>") != theirs.get(path, "<absent>")}
    known = {path for path in differ if any(fnmatch.fnmatch(path, pattern) for pattern in KNOWN_DIFFERENCES)}
    unexplained = {path: (ours.get(path, "<absent>"), theirs.get(path, "<absent>")) for path in sorted(differ - known)}
    assert not unexplained, "dcmirror answers otherwise than Kafka (dcmirror, Kafka):\n" + "\n".join(
        f"  {path}: {a!r} / {b!r}" for path, (a, b) in unexplained.items())
    stale = [p for p in KNOWN_DIFFERENCES if not any(fnmatch.fnmatch(path, p) for path in differ)]
    assert not stale, f"listed in KNOWN_DIFFERENCES but the answers agree now: {stale}"
    assert theirs["createTopics.new.partitions"] == 3 and theirs["deleteRecords.to_4"] == 4  # the run did run


# --------------------------------------------------------------------------- share groups (KIP-932)


def test_java_share_consumer_releases_and_accepts(driver: JavaDriver, dcmirror_broker: BrokerProcess) -> None:
    """Kafka's own KafkaShareConsumer (explicit acknowledgements) on a dcmirror broker, a
    preview (docs/share_groups.md): every record accepted once, each released one delivered
    again with delivery count 2, commitSync without errors."""
    topic, partitions, count = "java-share", 2, 200
    create_topic(dcmirror_broker.bootstrap, topic, partitions, 1)
    [out] = driver.run("share", timeout_s=180, bootstrap=dcmirror_broker.bootstrap, topic=topic, group="java-share",
                       count=count, partitions=partitions)
    assert "error" not in out, out
    assert out["accepted"] == count
    deliveries = Counter(n for _, _, _, n in out["records"])
    released = {n for n in range(count) if n % 4 == 0}
    assert {n for n, k in deliveries.items() if k == 2} == released and max(deliveries.values()) == 2
    assert sorted(d for _, _, d, n in out["records"] if n in released) == [1] * len(released) + [2] * len(released)
    assert all(d == 1 for _, _, d, n in out["records"] if n not in released)


def test_java_share_consumer_record_limit_renews_past_its_locks(driver: JavaDriver, broker_factory: Any) -> None:
    """Kafka 4.3.1's KafkaShareConsumer with share.acquire.mode=record_limit and RENEW
    (ShareFetch/ShareAcknowledge v2), the group's lock set to 1 s by the Java Admin client: each
    record, renewed on every poll, is held past several of its locks and accepted, and none is
    ever delivered twice (a lock that ran out, or a batch acquired beyond MaxRecords and left
    waiting in the client, would deliver it again); acquisitionLockTimeoutMs is the group's."""
    lock_ms, hold_ms, count = 1_000, 2_500, 3
    broker = broker_factory("share-renew", group_initial_rebalance_delay_ms=0,
                            **{"group.share.min.record.lock.duration.ms": lock_ms})
    topic = "java-share-renew"
    create_topic(broker.bootstrap, topic, 1, 1)
    [out] = driver.run("share-renew", timeout_s=180, bootstrap=broker.bootstrap, topic=topic, group="java-renew",
                       count=count, lock_ms=lock_ms, hold_ms=hold_ms)
    assert "error" not in out, out
    assert out["lock_ms"] == lock_ms
    assert [offset for offset, _, _, _ in out["records"]] == list(range(count))
    for offset, delivery, renewals, held in out["records"]:
        assert delivery == 1 and held >= hold_ms and renewals >= 2, (offset, delivery, renewals, held)


def test_kafka_share_groups_lists_and_describes_a_share_group(dcmirror_broker: BrokerProcess, tmp_path: Path) -> None:
    """kafka-share-groups (Kafka 4.3.1's ShareGroupCommand) against dcmirror while a share
    consumer is a member: --list names the group, --describe --members shows the member and
    its assignment, --describe --state the coordinator, Stable and one member. (--describe
    --offsets needs DescribeShareGroupOffsets: not served yet, docs/share_groups.md.)"""
    from confluent_kafka import ShareConsumer

    topic, group = "java-share-tool", "share-tool-group"
    create_topic(dcmirror_broker.bootstrap, topic, 2, 1)
    member = ShareConsumer({"bootstrap.servers": dcmirror_broker.bootstrap, "group.id": group, "log_level": 3})
    member.subscribe([topic])
    try:
        def assigned() -> bool:
            member.poll(0.2)
            out = tool("--describe", "--group", group, "--members")
            return f"{topic}:0,1" in out

        def tool(*args: str) -> str:
            done = run_tool("org.apache.kafka.tools.consumer.group.ShareGroupCommand", "--bootstrap-server",
                            dcmirror_broker.bootstrap, *args, cwd=tmp_path)
            assert done.returncode == 0, done.stderr[-2000:]
            return done.stdout

        wait_until(assigned, 60, "the member's assignment in kafka-share-groups --describe --members")
        assert group in tool("--list").split()
        state = tool("--describe", "--group", group, "--state").splitlines()[-1].split()
        assert state[0] == group and state[-2:] == ["Stable", "1"], state
    finally:
        member.close()
