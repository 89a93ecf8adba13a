"""Helpers for tests of multi-broker clusters (tests/fault, tests/mirror, tests/ops,
tests/perf): real `dcmirror broker --config --cluster --node` processes, real Kafka clients
(confluent-kafka, kafka-python where librdkafka hides a field).

The helpers here poll with deadlines and, when a deadline passes, fail with what was last
seen and the tail of every broker's log.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from cluster.broker.config import BROKER_CONFIG_DEFS
from tests.harness import ClusterProcesses


def _default_s(name: str) -> float:
    return int(BROKER_CONFIG_DEFS[name].default) / 1000


# The defaults every test cluster here runs with.
SESSION_TIMEOUT_S = _default_s("broker.session.timeout.ms")
ELECTION_TIMEOUT_S = _default_s("controller.quorum.election.timeout.ms")  # randomized up to 2x
HEARTBEAT_INTERVAL_S = _default_s("broker.heartbeat.interval.ms")

T = TypeVar("T")


class NotYet(Exception):
    """A poll saw a state that is not the awaited one (yet)."""


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str,
               cluster: ClusterProcesses | None = None, interval_s: float = 0.05) -> T:
    """Call predicate() until it returns something truthy; return that.

    NotYet and client errors count as "not yet". On timeout: AssertionError naming `what`,
    the last value or error seen and the cluster's logs.
    """
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except (NotYet, KafkaException, OSError) as exc:
            last = exc
        if time.monotonic() >= deadline:
            if cluster is not None:
                cluster.dump_stacks()
            logs = f"\n{log_tails(cluster)}" if cluster is not None else ""
            raise AssertionError(f"not within {timeout_s:.1f}s: {what}; last seen: {last!r}{logs}")
        time.sleep(interval_s)


_INTERNAL_PARTITION_LINE = re.compile(r"(leads|follows|ISR of|recovered|loaded) __transaction_state-")


def log_tails(cluster: ClusterProcesses, lines: int = 40) -> str:
    """The last lines of every node's log, without the per-partition lines about the
    internal topics (50 partitions each: leadership, ISR, recovery) that would crowd out the rest."""
    out = []
    for node_id, broker in cluster.brokers.items():
        kept = [line for line in broker.log_text().splitlines()
                if "__consumer_offsets" not in line and not _INTERNAL_PARTITION_LINE.search(line)]
        out.append(f"---- node {node_id} ----\n" + "\n".join(kept[-lines:]))
    return "\n".join(out)


# --------------------------------------------------------------------------- clients


def admin(bootstrap: str, **extra: object) -> AdminClient:
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "socket.connection.setup.timeout.ms": 3000,
        "reconnect.backoff.max.ms": 500,
        "log_level": 2,  # connection refused to a killed broker is expected here
    }
    conf.update(extra)
    return AdminClient(conf)


def metadata(bootstrap: str, topic: str | None = None, timeout_s: float = 5.0) -> ClusterMetadata:
    """Metadata from any of the given brokers (a fresh client, so no cached answer)."""
    return admin(bootstrap).list_topics(topic=topic, timeout=timeout_s)


@dataclass(frozen=True)
class NodeMetadata:
    """A Metadata answer from one known node (kcat -L -J names the answering broker;
    librdkafka's orig_broker_id in confluent-kafka is -1 or another node too often)."""

    node: int
    controller_id: int
    brokers: frozenset[int]
    topics: dict[str, Any]


def metadata_from(cluster: ClusterProcesses, node_id: int, topic: str | None = None,
                  timeout_s: float = 5.0) -> NodeMetadata:
    """Metadata answered by node `node_id` itself."""
    cmd = ["kcat", "-L", "-J", "-b", cluster[node_id].bootstrap, "-m", str(max(1, round(timeout_s))),
           "-X", "log_level=0"] + (["-t", topic] if topic else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 10)
    if out.returncode != 0:
        raise NotYet(f"kcat -L on node {node_id}: {out.stderr.strip()[-300:]}")
    doc = json.loads(out.stdout)
    origin = doc["originating_broker"]["id"]
    if origin != node_id:
        raise NotYet(f"metadata came from node {origin}, not {node_id}")
    return NodeMetadata(node_id, doc["controllerid"], frozenset(b["id"] for b in doc["brokers"]),
                        {t["topic"]: t for t in doc["topics"]})


def create_topic(bootstrap: str, name: str, partitions: int, rf: int, timeout_s: float = 30.0,
                 config: dict[str, str] | None = None) -> None:
    """CreateTopics; raises KafkaException with the broker's error on failure."""
    client = admin(bootstrap)  # referenced until the answer: a collected client cancels it
    futures = client.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=rf, config=config or {})],
        operation_timeout=timeout_s, request_timeout=timeout_s)
    futures[name].result(timeout=timeout_s)


@dataclass(frozen=True)
class PartitionView:
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def partitions_of(md: ClusterMetadata | NodeMetadata, topic: str) -> dict[int, PartitionView]:
    t = md.topics.get(topic)
    if isinstance(md, NodeMetadata):
        if t is None or t.get("error"):
            raise NotYet(f"topic {topic} on node {md.node}: {t.get('error') if t else 'missing'}")
        return {p["partition"]: PartitionView(p["leader"], tuple(r["id"] for r in p["replicas"]),
                                              tuple(r["id"] for r in p["isrs"]))
                for p in t["partitions"]}
    if t is None or t.error is not None:
        raise NotYet(f"topic {topic}: {t.error if t else 'missing'}")
    return {p.id: PartitionView(p.leader, tuple(p.replicas), tuple(p.isrs)) for p in t.partitions.values()}


def kafka_python_partitions(bootstrap: str, topic: str) -> dict[int, dict[str, Any]]:
    """Metadata partitions as kafka-python sees them: librdkafka does not expose
    offline_replicas or leader_epoch."""
    from kafka.admin import KafkaAdminClient

    client = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        (t,) = client.describe_topics([topic])
    finally:
        client.close()
    if t["error_code"] != 0:
        raise NotYet(f"topic {topic}: error {t['error_code']}")
    return {p["partition_index"]: p for p in t["partitions"]}


# --------------------------------------------------------------------------- cluster state


ACTIVE = re.compile(r"node (\d+) is the active controller \(epoch (\d+), metadata offset (\d+)\)")
RESIGNED = re.compile(r"node (\d+) is no longer the active controller")
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", re.M)


def activation_wall_time(text: str, node: int) -> float | None:
    """Wall-clock time of the first "node N is the active controller" line in `text`."""
    for line in text.splitlines():
        m = ACTIVE.search(line)
        if m and int(m.group(1)) == node:
            stamp = LOG_TIME.match(line)
            if stamp:
                return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def activations(cluster: ClusterProcesses) -> list[tuple[int, int]]:
    """(node, epoch) for every "is the active controller" line in every node's whole log."""
    found = []
    for node_id, broker in cluster.brokers.items():
        for m in ACTIVE.finditer(broker.log_text()):
            assert int(m.group(1)) == node_id, m.group(0)
            found.append((node_id, int(m.group(2))))
    return found


def latest_epoch_of(cluster: ClusterProcesses, node_id: int) -> int | None:
    epochs = [e for n, e in activations(cluster) if n == node_id]
    return max(epochs) if epochs else None


def agreed_controller(cluster: ClusterProcesses, nodes: list[int], brokers: set[int] | None = None) -> int:
    """The controller id every node in `nodes` reports, once they agree and (if given) list
    exactly `brokers`; that node's log must say it became the active controller."""
    ids = set()
    for n in nodes:
        md = metadata_from(cluster, n)
        if brokers is not None and set(md.brokers) != brokers:
            raise NotYet(f"node {n} lists brokers {sorted(md.brokers)}, want {sorted(brokers)}")
        ids.add(md.controller_id)
    if len(ids) != 1:
        raise NotYet(f"nodes {nodes} report controllers {sorted(ids)}")
    (controller,) = ids
    if controller not in nodes or latest_epoch_of(cluster, controller) is None:
        # A node that knows no leader names itself (never -1): not a controller yet.
        raise NotYet(f"node {controller} is reported but has not logged becoming controller")
    return controller


def topic_ready(cluster: ClusterProcesses, topic: str, partitions: int, rf: int,
                bootstrap: str | None = None) -> dict[int, PartitionView]:
    """Metadata shows `partitions` partitions with rf replicas, a leader and a full ISR each."""
    parts = partitions_of(metadata(bootstrap or cluster.bootstrap, topic), topic)
    if len(parts) != partitions:
        raise NotYet(f"{topic} has {len(parts)} partitions")
    for i, p in parts.items():
        if len(p.replicas) != rf or p.leader < 0 or set(p.isr) != set(p.replicas):
            raise NotYet(f"{topic}-{i}: {p}")
    return parts


def led_by(bootstrap: str, topic: str, partitions: int, nodes: list[int]) -> dict[int, PartitionView]:
    """Metadata shows `partitions` partitions, each led by one of `nodes` with an ISR of
    those nodes only (the others fenced and out of the ISRs)."""
    parts = partitions_of(metadata(bootstrap, topic), topic)
    if len(parts) != partitions or any(p.leader not in nodes or not set(p.isr) <= set(nodes)
                                       for p in parts.values()):
        raise NotYet(parts)
    return parts


def log_mark(cluster: ClusterProcesses) -> dict[int, int]:
    """Current length of every node's log, to look only at what comes after."""
    return {n: len(b.log_text()) for n, b in cluster.brokers.items()}


def log_since(cluster: ClusterProcesses, node_id: int, mark: dict[int, int]) -> str:
    return cluster[node_id].log_text()[mark[node_id]:]


def fast_teardown(cluster_factory: Callable[..., ClusterProcesses]) -> Iterator[Callable[..., ClusterProcesses]]:
    """Wrap cluster_factory so teardown kills what is left (SIGCONT first, then SIGKILL)
    instead of stopping brokers one by one: the last broker of a cluster waits out its
    controlled shutdown with no quorum left, which costs ~10 s per test."""
    made: list[ClusterProcesses] = []

    def make(*args: Any, **kwargs: Any) -> ClusterProcesses:
        cluster = cluster_factory(*args, **kwargs)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        for broker in cluster.brokers.values():
            if broker.alive():
                broker.resume()
                broker.kill9()



def produce_acked(bootstrap: str, topic: str, values: Iterable[int], partition: int = 0) -> list[int]:
    """Each value as one record of `topic`-`partition` (idempotent, acks=all), every one
    acknowledged: their offsets, in the order given."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "message.timeout.ms": 30_000, "log_level": 2})
    offsets: dict[int, int] = {}
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            offsets[int(msg.value())] = msg.offset()

    values = list(values)
    for v in values:
        producer.produce(topic, value=str(v).encode(), partition=partition, on_delivery=delivered)
    assert producer.flush(40) == 0, "records left unacknowledged"
    assert not errors, errors
    return [offsets[v] for v in values]


# ListOffsets answers a client that asks a partition which is between leaders, or whose new
# leader's high watermark still lags its epoch's start (OFFSET_NOT_AVAILABLE, as Kafka's
# does), with a retriable error; librdkafka's get_watermark_offsets hands it to the caller.
WATERMARK_RETRIABLE = frozenset({KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.LEADER_NOT_AVAILABLE,
                                 KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART,
                                 KafkaError._TIMED_OUT})


def watermarks(consumer: Any, topic: str, partition: int, timeout_s: float = 60.0) -> tuple[int, int]:
    """(low, high) watermark of a partition at its leader, asked again while the answer is
    retriable (the partition between leaders), until `timeout_s`."""
    from confluent_kafka import TopicPartition

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            if exc.args[0].code() not in WATERMARK_RETRIABLE or time.monotonic() >= deadline:
                raise
        time.sleep(0.2)
