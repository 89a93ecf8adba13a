"""MirrorMaker 2 as a client: Kafka's connect-mirror driver (dedicated mode, one JVM with a
herder per flow) mirrors between two dcmirror brokers.

- a->b mirrors `orders` (records before MM2 started and while it runs) and the compacted
  `accounts`: every record arrives once in `a.<topic>` on b (MM2's default replication
  policy) at the same partition and offset, with its key, value, headers and timestamp.
- Checkpoints: groups committed on a are checkpointed into a.checkpoints.internal on b and
  their offsets synced to b (sync.group.offsets.enabled), translated through the offset
  syncs MM2 writes to mm2-offset-syncs.b.internal on a. A group at the end of a partition
  translates exactly; one in the middle to an offset at or below its own, or not at all
  (MM2 translates conservatively from the sparse syncs it kept: never past a record the
  group has not consumed).
- Topic configs follow the source (DescribeConfigs on a, IncrementalAlterConfigs on b):
  the compacted topic stays compacted, a changed retention.ms arrives.
- MM2's internal topics (Connect's mm2-offsets/configs/status per herder, heartbeats,
  a.heartbeats, the checkpoints and offset-syncs topics) are created compacted; the brokers
  roll segments every few seconds and clean eagerly, so they are compacted while MM2 runs;
  a restarted MM2 reads its compacted configs and source offsets back and resumes where it
  stopped (no record mirrored twice).

Reference run against Apache Kafka (the same test, two real KRaft brokers instead):
DCMIRROR_MM2_PEER=kafka pytest tests/kafka/test_mm2.py
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from tests.harness import BrokerProcess
from tests.peers.fetch import classpath
from tests.peers.kafka import TOOL_JVM, KafkaCluster, java

pytestmark = [pytest.mark.timeout(300)]

T = TypeVar("T")
PEER = os.environ.get("DCMIRROR_MM2_PEER", "dcmirror")  # "kafka": the reference run
MM2_MAIN = "org.apache.kafka.connect.mirror.MirrorMaker"
# Both clusters (Kafka's broker config names): segments roll every 2 s and the cleaner runs
# often, so MM2's compacted topics are compacted while it runs.
BROKER_CONFIG: dict[str, object] = {
    "group.initial.rebalance.delay.ms": 0,
    "log.roll.ms": 2000,
    "log.cleaner.backoff.ms": 200,
    "log.cleaner.min.cleanable.ratio": 0.01,
}
MM2_JVM = tuple(o for o in TOOL_JVM if not o.startswith("-Xmx")) + ("-Xmx512m",)
WAIT_S = 90.0  # bound of every wait on MM2's progress (its JVM starts in 10-30 s on 2 busy cores)
ORDERS, ACCOUNTS = "orders", "accounts"
# CreateTime an hour ago: well inside retention.ms (Kafka deletes segments older than it 30 s
# after it starts, log.initial.task.delay.ms; the reference run must keep them too).
TS0 = (int(time.time()) - 3600) * 1000


def mm2_properties(a: str, b: str) -> str:
    lines = {
        "clusters": "a, b",
        "a.bootstrap.servers": a,
        "b.bootstrap.servers": b,
        "a->b.enabled": "true",
        "a->b.topics": f"{ORDERS}, {ACCOUNTS}",
        "b->a.enabled": "false",
        "plugin.discovery": "service_load",  # MM2's own plugins  # its herder still runs: heartbeats into a, replicated as a.heartbeats
        # Worker (herder) settings are per target cluster: <cluster>.<name>.
        **{f"{c}.{k}": v for c in ("a", "b") for k, v in (
            ("plugin.discovery", "service_load"),  # not a 20 s scan of every class on the classpath
            ("offset.flush.interval.ms", "1000"),
        )},
        "replication.factor": "1",
        "checkpoints.topic.replication.factor": "1",
        "heartbeats.topic.replication.factor": "1",
        "offset-syncs.topic.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "config.storage.replication.factor": "1",
        "tasks.max": "1",
        "sync.group.offsets.enabled": "true",
        "sync.group.offsets.interval.seconds": "1",
        "emit.checkpoints.interval.seconds": "1",
        "emit.heartbeats.interval.seconds": "1",
        "refresh.topics.interval.seconds": "2",
        "refresh.groups.interval.seconds": "2",
        "sync.topic.configs.interval.seconds": "2",
        "offset.lag.max": "0",
    }
    return "".join(f"{k} = {v}\n" for k, v in lines.items())


LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
"""


class MirrorMaker2:
    """MM2's dedicated-mode driver as a child process; its log in <root>/mm2.log."""

    def __init__(self, root: Path, a: str, b: str) -> None:
        self.root = root
        self.props = root / "mm2.properties"
        self.props.write_text(mm2_properties(a, b))
        self.log_path = root / "mm2.log"
        (root / "log4j2.properties").write_text(LOG4J2.format(path=self.log_path))
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "MM2 runs already"
        self.starts += 1
        with open(self.root / "mm2.out", "ab") as out:
            self.proc = subprocess.Popen(
                [java(), *MM2_JVM, f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
                 "-cp", classpath("kafka"), MM2_MAIN, str(self.props)],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.root)

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM: MM2 stops its herders, which commit their tasks' source offsets."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"MM2 did not stop within {timeout_s:.0f} s of SIGTERM") from None

    def problems(self, limit: int = 40) -> str:
        """Its last WARN and ERROR lines (and its exit status if it exited)."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        picked = [line for line in text.splitlines() if "] WARN " in line or "] ERROR " in line]
        exited = "" if self.proc is None or self.proc.poll() is None else f"MM2 exited with {self.proc.returncode}\n"
        return exited + "\n".join(picked[-limit:])


@dataclass
class Mirror:
    a: str
    b: str
    mm2: MirrorMaker2
    logs: Callable[[], str]
    sent: dict[str, list[tuple[bytes, bytes]]]  # source topic -> (key, value) produced into a, in order


def wait_for(predicate: Callable[[], T | None], what: str, mirror: Mirror, timeout_s: float = WAIT_S) -> T:
    """predicate() until truthy (client errors count as not yet); on timeout, what was last
    seen, MM2's warnings and the brokers' log tails."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except KafkaException as exc:
            last = exc
        if mirror.mm2.proc is not None and mirror.mm2.proc.poll() is not None:
            raise AssertionError(f"MM2 exited while waiting for {what}:\n{mirror.mm2.problems()}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}; last seen: {last!r}\n"
                                 f"---- MM2 warnings ----\n{mirror.mm2.problems()}\n{mirror.logs()}")
        time.sleep(0.2)


# ---- the two clusters: dcmirror brokers, or Kafka for the reference run ----

@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mirror]:
    root = tmp_path_factory.mktemp("mm2")
    stops: list[Callable[[], object]] = []
    try:
        if PEER == "kafka":
            ka = KafkaCluster(root / "kafka-a", config=BROKER_CONFIG).start()
            stops.append(ka.stop)
            kb = KafkaCluster(root / "kafka-b", config=BROKER_CONFIG).start()
            stops.append(kb.stop)
            a, b = ka.bootstrap, kb.bootstrap

            def logs() -> str:
                return "\n".join(f"---- {n} ----\n{c[1].log_text()[-3000:]}" for n, c in (("a", ka), ("b", kb)))
        else:
            overrides: dict[str, Any] = {k.replace(".", "_"): v for k, v in BROKER_CONFIG.items()}
            ba = BrokerProcess(root / "a" / "broker", **overrides).start()
            stops.append(ba.stop)
            bb = BrokerProcess(root / "b" / "broker", **overrides).start()
            stops.append(bb.stop)
            a, b = ba.bootstrap, bb.bootstrap

            def logs() -> str:
                return "\n".join(f"---- broker {n} ----\n{p.log_text()[-3000:]}" for n, p in (("a", ba), ("b", bb)))
        admin = AdminClient({"bootstrap.servers": a})
        for future in admin.create_topics([
                NewTopic(ORDERS, 2, 1),
                NewTopic(ACCOUNTS, 1, 1, config={"cleanup.policy": "compact", "retention.ms": "86400000"}),
        ]).values():
            future.result(30)
        mm2 = MirrorMaker2(root, a, b)
        m = Mirror(a, b, mm2, logs, {ORDERS: [], ACCOUNTS: []})
        produce(m, ORDERS, 200)  # before MM2 runs
        produce(m, ACCOUNTS, 60, keys=12)
        stops.append(mm2.stop)
        mm2.start()
        yield m
    finally:
        for stop in reversed(stops):
            stop()


def produce(m: Mirror, topic: str, count: int, *, keys: int = 0) -> None:
    """`count` records with keys, two headers and CreateTime timestamps, round-robin over
    the partitions (`keys`: that many distinct keys, for the compacted topic)."""
    partitions = 2 if topic == ORDERS else 1
    producer = Producer({"bootstrap.servers": m.a, "linger.ms": 5, "enable.idempotence": True})
    errors: list[object] = []
    for _ in range(count):
        n = len(m.sent[topic])
        key, value = (f"k{n % keys}" if keys else f"k{n}").encode(), f"{topic}-{n}".encode()
        producer.produce(topic, value=value, key=key, partition=n % partitions,
                         timestamp=TS0 + n, headers=[("n", str(n).encode()), ("empty", b"")],
                         on_delivery=lambda err, _msg: errors.append(err) if err else None)
        m.sent[topic].append((key, value))
    assert producer.flush(30) == 0 and not errors, f"producing into {topic}: {errors[:3]}"


def read_all(bootstrap: str, topic: str, partitions: int) -> list[tuple[Any, ...]]:
    """Every record of the topic up to its end offsets now: (partition, offset, key, value,
    headers, timestamp type, timestamp)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "mm2-test-reader", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        todo = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in todo])
        out: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + 30
        while todo:
            assert time.monotonic() < deadline, f"reading {topic} on {bootstrap}: partitions {todo} not at their end"
            for msg in consumer.consume(500, timeout=1):
                error, partition, offset = msg.error(), msg.partition(), msg.offset()
                assert partition is not None and offset is not None
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        todo.discard(partition)
                        continue
                    raise KafkaException(error)
                if offset >= ends[partition]:
                    todo.discard(partition)
                    continue
                ts_type, ts = msg.timestamp()
                out.append((partition, offset, msg.key(), msg.value(), msg.headers() or [], ts_type, ts))
                if offset + 1 >= ends[partition]:
                    todo.discard(partition)
        return sorted(out)
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "mm2-test-reader"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        consumer.close()


def topic_names(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    """The topic's configs that are not defaults."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return {k: v.value for k, v in future.result(10).items() if not v.is_default}


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The group's committed offsets (-1001: none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return {(tp.topic, tp.partition): tp.offset
                for tp in consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=10)}
    finally:
        consumer.close()


def checkpoints(bootstrap: str) -> list[tuple[str, str, int, int, int]]:
    """a.checkpoints.internal decoded (MM2's Checkpoint: key group, topic, partition; value
    version, upstream offset, downstream offset, metadata)."""
    out = []
    for _, _, key, value, _, _, _ in read_all(bootstrap, "a.checkpoints.internal", 1):
        glen = struct.unpack_from(">h", key)[0]
        group = key[2:2 + glen].decode()
        tlen = struct.unpack_from(">h", key, 2 + glen)[0]
        topic = key[4 + glen:4 + glen + tlen].decode()
        (partition,) = struct.unpack_from(">i", key, 4 + glen + tlen)
        version, upstream, downstream = struct.unpack_from(">hqq", value)
        assert version == 0
        out.append((group, topic, partition, upstream, downstream))
    return out


def mirrored_as_sent(m: Mirror, topic: str, partitions: int) -> bool:
    """a.<topic> on b ends where <topic> on a does."""
    return f"a.{topic}" in topic_names(m.b) and \
        end_offsets(m.b, f"a.{topic}", partitions) == end_offsets(m.a, topic, partitions)


def wait_mirrored(m: Mirror, topic: str, partitions: int, when: str) -> None:
    wait_for(lambda: mirrored_as_sent(m, topic, partitions), f"a.{topic} on b at {topic}'s end on a {when}", m)


def latest_by_key(records: list[tuple[Any, ...]]) -> dict[bytes, bytes]:
    return {r[2]: r[3] for r in sorted(records, key=lambda r: r[1])}


def check_compacted_copy(m: Mirror, when: str) -> None:
    """a.accounts on b: MM2 copies what the cleaner left of the compacted source (so the copy
    has its own offsets, as between Kafka clusters): in the order produced, none twice, the
    latest value of every key."""
    produced = dict(m.sent[ACCOUNTS])  # key -> latest value
    wait_for(lambda: f"a.{ACCOUNTS}" in topic_names(m.b) and
             latest_by_key(read_all(m.b, f"a.{ACCOUNTS}", 1)) == produced,
             f"a.{ACCOUNTS} on b with the latest value of every key {when}", m)
    copied = [(r[2], r[3]) for r in read_all(m.b, f"a.{ACCOUNTS}", 1)]
    order = {kv: i for i, kv in enumerate(m.sent[ACCOUNTS])}
    positions = [order[kv] for kv in copied]
    assert positions == sorted(set(positions)), "a.accounts holds a record twice or out of the order produced"
    headers = {tuple(r[4]) for r in read_all(m.b, f"a.{ACCOUNTS}", 1)}
    assert all(dict(h).keys() == {"n", "empty"} for h in headers)


# ---- the tests, in the order MM2's work happens ----

def test_every_record_arrives_once(mirror: Mirror) -> None:
    produce(mirror, ORDERS, 100)  # while MM2 runs
    produce(mirror, ACCOUNTS, 30, keys=12)
    wait_mirrored(mirror, ORDERS, 2, "(records from before MM2 started and while it runs)")
    source, target = read_all(mirror.a, ORDERS, 2), read_all(mirror.b, f"a.{ORDERS}", 2)
    assert len(source) == len(mirror.sent[ORDERS])
    assert target == source  # same partitions, offsets, keys, values, headers, CreateTime timestamps
    check_compacted_copy(mirror, "(records from before MM2 started and while it runs)")


def test_checkpoints_translate_group_offsets(mirror: Mirror) -> None:
    wait_mirrored(mirror, ORDERS, 2, "")
    ends = end_offsets(mirror.a, ORDERS, 2)
    middle = {p: end // 2 for p, end in ends.items()}
    commit(mirror.a, "done", {(ORDERS, p): end for p, end in ends.items()})
    commit(mirror.a, "halfway", {(ORDERS, p): o for p, o in middle.items()})
    tps = [(f"a.{ORDERS}", p) for p in ends]

    # The checkpoint connector finds the new groups (refresh.groups.interval.seconds), its
    # task checkpoints them, the group offsets follow on b.
    at_end = {(t, p): ends[p] for t, p in tps}
    wait_for(lambda: committed(mirror.b, "done", tps) == at_end, "group 'done' synced to b at the end offsets", mirror)

    expected = {(f"a.{ORDERS}", p): (end, end) for p, end in ends.items()}

    def last_checkpoints() -> dict[tuple[str, int], tuple[int, int]] | None:
        got = {(t, p): (u, d) for g, t, p, u, d in checkpoints(mirror.b) if g == "done"}  # the last of each
        return got if got == expected else None

    wait_for(last_checkpoints, "checkpoints of group 'done': its end offsets on a and on b", mirror)
    # A group halfway may be translated lower than its offset, or not at all: MM2 keeps a
    # sparse set of offset syncs, and the offset-syncs topic is compacted (one sync per
    # partition survives), so a checkpoint task started after a compaction knows only the
    # latest sync and declines older offsets. Never past the group's own offset, though.
    for (_, p), offset in committed(mirror.b, "halfway", tps).items():
        assert offset < 0 or offset <= middle[p], f"halfway p{p}: {offset} on b is past its {middle[p]} on a"


def test_topic_configs_follow_the_source(mirror: Mirror) -> None:
    wait_for(lambda: f"a.{ACCOUNTS}" in topic_names(mirror.b), "a.accounts created on b", mirror)
    assert topic_configs(mirror.b, f"a.{ACCOUNTS}").get("cleanup.policy") == "compact"
    admin = AdminClient({"bootstrap.servers": mirror.a})
    resource = ConfigResource("topic", ACCOUNTS, incremental_configs=[
        ConfigEntry("retention.ms", "172800000", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(10)
    wait_for(lambda: topic_configs(mirror.b, f"a.{ACCOUNTS}").get("retention.ms") == "172800000",
             "a.accounts' retention.ms as changed on a", mirror)
    assert topic_configs(mirror.b, f"a.{ACCOUNTS}").get("cleanup.policy") == "compact"


INTERNAL_ON_B = ("mm2-configs.a.internal", "mm2-offsets.a.internal", "mm2-status.a.internal", "heartbeats",
                 "a.heartbeats", "a.checkpoints.internal")
INTERNAL_ON_A = ("mm2-configs.b.internal", "mm2-offsets.b.internal", "mm2-status.b.internal", "heartbeats",
                 "mm2-offset-syncs.b.internal")


def compacted(bootstrap: str, topic: str) -> bool:
    """The cleaner removed records of the topic: fewer records below the end offset than offsets."""
    partitions = len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics[topic].partitions)
    ends = end_offsets(bootstrap, topic, partitions)
    return len(read_all(bootstrap, topic, partitions)) < sum(ends.values())


def test_restart_reads_compacted_internal_topics(mirror: Mirror) -> None:
    for side, bootstrap, names in (("b", mirror.b, INTERNAL_ON_B), ("a", mirror.a, INTERNAL_ON_A)):
        wait_for(lambda: set(names) <= topic_names(bootstrap), f"MM2's internal topics on {side}", mirror)  # noqa: B023
        for name in names:
            assert topic_configs(bootstrap, name).get("cleanup.policy") == "compact", f"{name} on {side}"
    # heartbeats (one record a second, one key) and the herder's source offsets (one flush a
    # second while records flow) are compacted while MM2 runs.
    wait_for(lambda: compacted(mirror.b, "heartbeats"), "heartbeats on b compacted", mirror)
    produce(mirror, ORDERS, 20)
    wait_mirrored(mirror, ORDERS, 2, "")
    wait_for(lambda: compacted(mirror.b, "mm2-offsets.a.internal"), "mm2-offsets.a.internal compacted", mirror)

    mirror.mm2.stop()
    produce(mirror, ORDERS, 50)  # while MM2 is down
    produce(mirror, ACCOUNTS, 10, keys=12)
    mirror.mm2.start()
    wait_mirrored(mirror, ORDERS, 2, "after the restart")
    assert read_all(mirror.b, f"a.{ORDERS}", 2) == read_all(mirror.a, ORDERS, 2)  # none twice
    check_compacted_copy(mirror, "after the restart")
    # The restarted checkpoint task translates again: a group moved to the new end follows.
    ends = end_offsets(mirror.a, ORDERS, 2)
    commit(mirror.a, "done", {(ORDERS, p): end for p, end in ends.items()})
    tps = [(f"a.{ORDERS}", p) for p in ends]
    wait_for(lambda: committed(mirror.b, "done", tps) == {(t, p): ends[p] for t, p in tps},
             "group 'done' at the new end offsets on b", mirror)
