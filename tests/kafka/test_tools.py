"""Kafka's own command-line tools against dcmirror (issue 30): each one exits 0 against a
3-broker dcmirror cluster and prints what it prints against Apache Kafka 4.3.1 (a 1-node
KRaft cluster); both have an authorizer (StandardAuthorizer, User:ANONYMOUS a super user on
their plaintext listeners, so kafka-acls works). The same command runs against both and the
outputs are compared line by line, with ids, ports, timestamps and rates normalized and the
rows of tables whose order comes from a Java hash map sorted; where a command's answer
depends on the cluster's size (reassignments, elections, quorum voters), dcmirror's output
is checked against the shape of Kafka's. The tools run in one warm JVM
(tests/peers/tool_runner.py).

Differences found, and what was done:

| tool | difference | resolution |
|---|---|---|
| kafka-features describe | printed nothing: no feature levels in ApiVersions v3 | fixed: ApiVersions reports metadata.version (3.9-IV0), group.version 1, kraft.version 0, transaction.version 0 |
| kafka-features describe | Kafka also lists eligible.leader.replicas | fixed: KIP-966 eligible leader replicas, eligible.leader.replicas.version 0-1, finalized at 1 in a new cluster as Kafka 4.1 |
| kafka-features describe | Kafka also lists share and streams versions and transaction.version 2 | documented: dcmirror has no share or streams groups, and no KIP-890 part 2 (at transaction.version 2 Kafka 4's Java producer would use it) |
| kafka-metadata-quorum describe | UnsupportedVersionException: no DescribeQuorum | fixed: DescribeQuorum v0-2 from the Raft leader's state (log end offsets, last fetch and caught-up times of voters and observers) |
| kafka-metadata-quorum describe | voters' endpoints are CONTROLLER listeners in Kafka | documented: dcmirror's nodes are combined and run the quorum on their inter-broker listener (PLAINTEXT here) |
| kafka-reassign-partitions --verify | "still in progress" forever when a replica was added to a partition whose log start DeleteRecords had moved into a batch: the new follower refused the leader's first batch | fixed: an empty follower log starts at that batch's base offset, then follows the leader's log start (Kafka's appendRecordsToFollowerOrFutureReplica) |
| kafka-reassign-partitions --execute --throttle | refused: leader/follower.replication.throttled.rate unknown broker configs | fixed: accepted and described (dcmirror does not throttle replication) |
| kafka-configs --describe (a topic, once log.retention.ms is set cluster-wide) | the synonyms ended at log.retention.ms; Kafka's go on to log.retention.hours' default | fixed: Kafka's synonym chains (log.retention.ms/.minutes/.hours, log.roll, log.roll.jitter, log.flush.interval.ms with the flush scheduler), layer by layer, from the config's own first entry on |
| kafka-configs --alter (broker) | log.cleaner.threads refused as an unknown broker config | fixed by the broker-config work beside this one (every Kafka broker config name is known, cluster/broker/kafka_configs.py) |
| kafka-transactions find-hanging --broker-id | failed: DescribeProducers answered NOT_LEADER_OR_FOLLOWER on followers | fixed: any replica answers (KIP-664) |
| kafka-transactions describe | CurrentTransactionStartTimeMs and TransactionDurationMs "None" for a completed transaction | fixed: the start time stays until the next InitProducerId, as Kafka's |
| kafka-transactions describe-producers | LatestCoordinatorEpoch -1 | fixed: each producer keeps the coordinator epoch of its last marker (kept in producer snapshots) |
| kafka-consumer-groups --describe of a missing group | "Consumer group 'g' does not exist." where Kafka says GroupIdNotFoundException | fixed: DescribeGroups v5-6 (KIP-1043: GROUP_ID_NOT_FOUND) |
| kafka-configs | the helper ran a class that is not in Kafka 4.3.1 (org.apache.kafka.tools.ConfigCommand) | fixed in tests/peers/kafka.py: kafka.admin.ConfigCommand |
| kafka-topics --list | dcmirror lists `__consumer_offsets` from the start (created with the cluster), Kafka from the first group | documented: compared with --exclude-internal |
| kafka-topics --describe, kafka-configs --entity-default | Kafka shows min.insync.replicas=1 as a cluster-wide dynamic config | fixed: with ELR (KIP-966) a new dcmirror cluster writes it too |
| kafka-configs --describe --all (topic) | dcmirror still has message.format.version, message.downconversion.enable and message.timestamp.difference.max.ms, and message.timestamp.after.max.ms defaults to Long.MAX | documented: Kafka 4.0 removed the three and made the bound one hour; dcmirror keeps Kafka 3.9's topic configs (the protocol it follows, Produce v0-2 included) |
| kafka-acls --list | the order of resources and entries differs from run to run | the tool's own (Java hash sets): compared as sets |
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from cluster.controller.features import SUPPORTED_FEATURES as FEATURES
from tests.harness import ClusterProcesses
from tests.peers.kafka import KafkaCluster
from tests.peers.tool_runner import KafkaTools

pytestmark = pytest.mark.timeout(300)

AUTHORIZER = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
              "super.users": "User:ANONYMOUS"}
# Both get these (Kafka's names), so internal topics are as small on both.
COMMON = {"offsets.topic.num.partitions": 3, "transaction.state.log.num.partitions": 3,
          "group.initial.rebalance.delay.ms": 0, **AUTHORIZER}
THROTTLE = ("--throttle", "50000000")  # bytes/s of replication while a reassignment runs
WAIT_S = 60.0  # bound of every wait for the clusters' progress
TARGETS = ("kafka", "dcmirror")


@dataclass
class Clusters:
    kafka: KafkaCluster
    dc: ClusterProcesses
    tools: KafkaTools
    admins: dict[str, AdminClient] = field(default_factory=dict)

    def bootstrap(self, target: str) -> str:
        return self.kafka.bootstrap if target == "kafka" else self.dc.bootstrap

    def admin(self, target: str) -> AdminClient:
        if target not in self.admins:
            self.admins[target] = AdminClient({"bootstrap.servers": self.bootstrap(target), "log_level": 2})
        return self.admins[target]

    def run(self, target: str, tool: str, *args: str, code: int = 0, input_text: str | None = None) -> str:
        """`tool --bootstrap-server <target> args...`: its stdout, once it exited with `code`."""
        proc = self.tools.run(tool, "--bootstrap-server", self.bootstrap(target), *args, input_text=input_text)
        if proc.returncode != code:
            logs = self.dc.logs(2000) if target == "dcmirror" else self.kafka[1].log_text()[-3000:]
            raise AssertionError(f"{tool} {' '.join(args)} against {target} exited {proc.returncode}:\n"
                                 f"{proc.stdout}\n{proc.stderr[-4000:]}\n{logs}")
        return proc.stdout

    def both(self, tool: str, *args: str, code: int = 0) -> tuple[str, str]:
        """The same command against Kafka and dcmirror: (Kafka's stdout, dcmirror's)."""
        out = [self.run(target, tool, *args, code=code) for target in TARGETS]
        return out[0], out[1]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    root = tmp_path_factory.mktemp("tools")
    dc = ClusterProcesses(root / "dcmirror", 3, **{k.replace(".", "_"): v for k, v in COMMON.items()})
    kafka = KafkaCluster(root / "kafka", size=1, config=COMMON)
    tools = KafkaTools(root / "tools")
    try:
        # Kafka's JVM, the tools' JVM (warming up) and the three Python brokers start side by side.
        warm = threading.Thread(target=tools.run, args=("kafka-topics", "--version"), daemon=True)
        warm.start()
        for broker in dc.brokers.values():
            broker.start(wait_ready=False)
        kafka.start()
        for broker in dc.brokers.values():
            broker.wait_ready(WAIT_S)
        warm.join(WAIT_S)
        assert not warm.is_alive(), f"the tools' JVM did not answer within {WAIT_S:.0f} s"
        yield Clusters(kafka, dc, tools)
    finally:
        tools.close()
        kafka.stop()
        dc.stop()


# ---- normalizing -----------------------------------------------------------------------------


def subst(text: str, *rules: tuple[str, str]) -> str:
    for pattern, repl in rules:
        text = re.sub(pattern, repl, text)
    return text


HOSTS = (r"127\.0\.0\.1:\d+", "HOST:PORT")


def rows(text: str) -> list[list[str]]:
    """A table as its lines' cells (columns are padded to the longest value: the widths
    differ where ids do)."""
    return [line.split() for line in text.strip().splitlines()]


def header_and_sorted_rows(text: str) -> tuple[list[str], list[list[str]]]:
    table = [r for r in rows(text) if r]
    return table[0], sorted(table[1:])


def acl_blocks(text: str) -> dict[str, set[str]]:
    """kafka-acls output as resource line -> its entries (the tool prints Java hash sets)."""
    blocks: dict[str, set[str]] = {}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("(principal="):
            blocks[current].add(line)
        else:
            current = line
            blocks.setdefault(current, set())
    return blocks


def wait_for(predicate: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll until `predicate` returns something truthy (a state reached), else fail naming it."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except Exception as exc:  # noqa: BLE001 - not there yet
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what} (last: {last!r})")


def produce(bootstrap: str, topic: str, n: int, *, partitions: int = 1) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "log_level": 2})
    for i in range(n):
        p.produce(topic, f"value-{i}".encode(), key=f"key-{i}".encode(), partition=i % partitions)
    assert p.flush(30) == 0


# ---- kafka-topics ------------------------------------------------------------------------------


def test_kafka_topics_create_list_describe_alter_delete(clusters: Clusters) -> None:
    k, d = clusters.both("kafka-topics", "--create", "--topic", "tools-topics", "--partitions", "2",
                         "--replication-factor", "1", "--config", "retention.ms=3600000")
    assert k == d == "Created topic tools-topics.\n"
    assert clusters.both("kafka-topics", "--create", "--topic", "tools-doomed", "--partitions", "1",
                         "--replication-factor", "1")[1] == "Created topic tools-doomed.\n"
    k, d = clusters.both("kafka-topics", "--alter", "--topic", "tools-topics", "--partitions", "3")
    assert k == d == ""
    k, d = clusters.both("kafka-topics", "--describe", "--topic", "tools-topics")
    rules = [(r"TopicId: \S+", "TopicId: ID"), (r"(Leader|Replicas|Isr): \d+", r"\1: N")]
    assert subst(k, *rules) == subst(d, *rules)
    assert "\tPartition: 2\t" in d and "Configs: min.insync.replicas=1,retention.ms=3600000" in d
    k, d = clusters.both("kafka-topics", "--describe", "--topic", "tools-topics", "--under-replicated-partitions")
    assert k == d == ""
    k, d = clusters.both("kafka-topics", "--delete", "--topic", "tools-doomed")
    assert k == d == ""
    k, d = clusters.both("kafka-topics", "--list", "--exclude-internal")
    assert sorted(k.splitlines()) == sorted(d.splitlines()) and "tools-topics" in d and "tools-doomed" not in d
    # dcmirror's internal topics are flagged as Kafka's (--exclude-internal left them out)
    assert "__consumer_offsets" in clusters.run("dcmirror", "kafka-topics", "--list").splitlines()


# ---- kafka-configs -----------------------------------------------------------------------------


# Kafka 4.0 removed these topic configs (or changed the default); dcmirror keeps Kafka 3.9's.
TOPIC_CONFIGS_OF_3_9 = ("message.downconversion.enable", "message.format.version",
                        "message.timestamp.difference.max.ms", "message.timestamp.after.max.ms")


def test_kafka_configs_topic_and_broker(clusters: Clusters) -> None:
    topic = ["--entity-type", "topics", "--entity-name", "tools-configs"]
    for target in TARGETS:
        clusters.run(target, "kafka-topics", "--create", "--topic", "tools-configs", "--partitions", "1",
                     "--replication-factor", "1")
    k, d = clusters.both("kafka-configs", "--alter", *topic, "--add-config",
                         "retention.ms=3600000,cleanup.policy=[compact,delete],max.message.bytes=2000000")
    assert k == d == "Completed updating config for topic tools-configs.\n"
    k, d = clusters.both("kafka-configs", "--describe", *topic)
    assert k == d and "cleanup.policy=compact,delete" in d
    k, d = clusters.both("kafka-configs", "--alter", *topic, "--delete-config", "retention.ms")
    assert k == d == "Completed updating config for topic tools-configs.\n"
    k, d = clusters.both("kafka-configs", "--describe", "--topic", "tools-configs")
    assert k == d and "retention.ms" not in d
    k, d = clusters.both("kafka-configs", "--describe", *topic, "--all")

    def kept(text: str) -> list[str]:
        return [line for line in text.splitlines()
                if line.split("=", 1)[0].strip() not in TOPIC_CONFIGS_OF_3_9]
    assert kept(k) == kept(d)

    broker = ["--entity-type", "brokers", "--entity-name", "1"]
    k, d = clusters.both("kafka-configs", "--alter", *broker, "--add-config",
                         "log.cleaner.threads=2,message.max.bytes=2000000")
    assert k == d == "Completed updating config for broker 1.\n"
    k, d = clusters.both("kafka-configs", "--describe", *broker)
    assert k == d and "message.max.bytes=2000000" in d
    # (before the topic's synonyms are compared: they show the answering broker's own configs,
    # and any of dcmirror's three brokers may answer)
    k, d = clusters.both("kafka-configs", "--alter", *broker, "--delete-config", "log.cleaner.threads,message.max.bytes")
    assert k == d == "Completed updating config for broker 1.\n"
    k, d = clusters.both("kafka-configs", "--describe", *broker)
    assert k == d == "Dynamic configs for broker 1 are:\n"
    default = ["--entity-type", "brokers", "--entity-default"]
    k, d = clusters.both("kafka-configs", "--alter", *default, "--add-config", "log.retention.ms=7200000")
    assert k == d == "Completed updating default config for brokers in the cluster.\n"
    k, d = clusters.both("kafka-configs", "--describe", *default)
    assert k == d and "log.retention.ms=7200000" in d and "min.insync.replicas=1" in d
    # the topic's synonyms now show the cluster-wide default under its own
    k, d = clusters.both("kafka-configs", "--describe", *topic, "--all")
    assert kept(k) == kept(d) and "DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=7200000" in d
    k, d = clusters.both("kafka-configs", "--alter", *default, "--delete-config", "log.retention.ms")
    assert k == d == "Completed updating default config for brokers in the cluster.\n"


# ---- kafka-acls --------------------------------------------------------------------------------


def test_kafka_acls_add_list_remove(clusters: Clusters) -> None:
    def both_blocks(*args: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        k, d = clusters.both("kafka-acls", *args)
        if "--list" in args:
            # Each broker applies an ACL change from the metadata log on its own (Kafka's
            # too): dcmirror's three may answer a listing from one still behind the change
            # that was just acknowledged. Asked again until it answers as Kafka (bounded).
            deadline = time.monotonic() + 30
            while acl_blocks(d) != acl_blocks(k) and time.monotonic() < deadline:
                time.sleep(0.2)
                d = clusters.run("dcmirror", "kafka-acls", *args)
        return acl_blocks(k), acl_blocks(d)

    k, d = both_blocks("--add", "--allow-principal", "User:alice", "--allow-host", "10.0.0.1", "--deny-principal",
                       "User:bob", "--deny-host", "10.0.0.2", "--operation", "Read", "--operation", "Describe",
                       "--topic", "tools-acl", "--group", "tools-readers")
    assert k == d and len(d) == 2 and all(len(entries) == 4 for entries in d.values())
    k, d = both_blocks("--add", "--allow-principal", "User:carol", "--operation", "Write", "--topic", "tools-",
                       "--resource-pattern-type", "prefixed")
    assert k == d
    k, d = both_blocks("--add", "--producer", "--allow-principal", "User:dan", "--topic", "tools-acl",
                       "--transactional-id", "tools-tx", "--idempotent")
    assert k == d and "(principal=User:dan, host=*, operation=IDEMPOTENT_WRITE, permissionType=ALLOW)" in \
        d["Adding ACLs for resource `ResourcePattern(resourceType=CLUSTER, name=kafka-cluster, patternType=LITERAL)`:"]
    k, d = both_blocks("--add", "--allow-principal", "User:alice", "--operation", "Read", "--topic", "tools-acl",
                       "--allow-host", "10.0.0.1")  # exists already
    assert k == d
    for listing in (["--list"], ["--list", "--topic", "tools-acl"], ["--list", "--principal", "User:alice"],
                    ["--list", "--topic", "tools-acl.x", "--resource-pattern-type", "match"],
                    ["--list", "--cluster"]):
        k, d = both_blocks(*listing)
        assert k == d and d, listing
    k, d = both_blocks("--remove", "--force", "--allow-principal", "User:alice", "--allow-host", "10.0.0.1",
                       "--operation", "Describe", "--topic", "tools-acl")
    assert k == d
    k, d = both_blocks("--list", "--topic", "tools-acl")
    assert k == d and len(next(iter(d.values()))) == 6  # 4 + dan's 3 - the one removed
    k, d = both_blocks("--remove", "--force", "--topic", "tools-acl", "--group", "tools-readers", "--cluster",
                       "--transactional-id", "tools-tx")
    assert k == d
    k, d = both_blocks("--remove", "--force", "--topic", "tools-", "--resource-pattern-type", "prefixed")
    assert k == d
    k, d = both_blocks("--list")
    assert k == d == {}


# ---- kafka-consumer-groups ------------------------------------------------------------------


class Member:
    """A librdkafka consumer in a group that reads `expect` records, commits, and stays a
    member until `leave()` (its background thread keeps polling)."""

    def __init__(self, bootstrap: str, topic: str, group: str, expect: int) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "tools-member",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 2})
        self.consumer.subscribe([topic])
        self.expect = expect
        self.read = 0
        self.committed = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                m = self.consumer.poll(0.2)
                if m is not None and m.error() is None:
                    self.read += 1
                    if self.read == self.expect:
                        self.consumer.commit(asynchronous=False)
                        self.committed.set()
        except BaseException as exc:  # noqa: BLE001 - reported by leave()
            self.error = exc
        finally:
            self.consumer.close()

    def leave(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert self.error is None, self.error


def group_state(clusters: Clusters, target: str, group: str) -> str:
    future = clusters.admin(target).describe_consumer_groups([group])[group]
    return str(future.result(10).state.name)


def test_kafka_consumer_groups_describe_reset_delete(clusters: Clusters) -> None:
    topic, group = "tools-groups", "tools-group"
    members = {}
    for target in TARGETS:
        clusters.run(target, "kafka-topics", "--create", "--topic", topic, "--partitions", "3",
                     "--replication-factor", "1")
        produce(clusters.bootstrap(target), topic, 30, partitions=3)
        members[target] = Member(clusters.bootstrap(target), topic, group, 30)
    try:
        for target, member in members.items():
            assert member.committed.wait(WAIT_S), f"{target}: the member read {member.read} of 30 records"
            wait_for(lambda t=target: group_state(clusters, t, group) == "STABLE", f"{target}: group {group} stable")
        ids = (r"tools-member-[0-9a-f-]+", "MEMBER"), (r"/127\.0\.0\.1", "/HOST")
        k, d = clusters.both("kafka-consumer-groups", "--describe", "--group", group)
        assert header_and_sorted_rows(subst(k, *ids)) == header_and_sorted_rows(subst(d, *ids))
        assert header_and_sorted_rows(subst(d, *ids))[1] == [
            [group, topic, str(i), "10", "10", "0", "MEMBER", "/HOST", "tools-member"] for i in range(3)]
        k, d = clusters.both("kafka-consumer-groups", "--describe", "--group", group, "--members", "--verbose")
        assert rows(subst(k, *ids)) == rows(subst(d, *ids))
        assert rows(subst(d, *ids))[1] == [group, "MEMBER", "/HOST", "tools-member", "3", "-", f"{topic}:0,1,2", "-", "-"]
        k, d = clusters.both("kafka-consumer-groups", "--describe", "--group", group, "--state")
        coordinator = (r"HOST:PORT\s+\(\d+\)", "COORDINATOR")
        assert rows(subst(k, HOSTS, coordinator)) == rows(subst(d, HOSTS, coordinator))
        assert rows(subst(d, HOSTS, coordinator))[1] == [group, "COORDINATOR", "range", "Stable", "1"]
        k, d = clusters.both("kafka-consumer-groups", "--list", "--state", "Stable")
        assert rows(k)[0] == rows(d)[0] and \
            [r for r in rows(k) if r[0] == group] == [r for r in rows(d) if r[0] == group] == [[group, "Stable"]]
    finally:
        for member in members.values():
            member.leave()
    for target in TARGETS:
        wait_for(lambda t=target: group_state(clusters, t, group) == "EMPTY", f"{target}: group {group} empty")
    for reset in (["--to-earliest", "--dry-run"], ["--shift-by", "-2", "--execute"],
                  ["--to-datetime", "2020-01-01T00:00:00.000", "--execute"], ["--to-offset", "4", "--execute"]):
        k, d = clusters.both("kafka-consumer-groups", "--reset-offsets", "--group", group, "--topic", topic, *reset)
        assert header_and_sorted_rows(k) == header_and_sorted_rows(d), reset
    k, d = clusters.both("kafka-consumer-groups", "--reset-offsets", "--group", group, "--topic", f"{topic}:0,2",
                         "--to-latest", "--execute")
    assert header_and_sorted_rows(k) == header_and_sorted_rows(d)
    k, d = clusters.both("kafka-consumer-groups", "--delete-offsets", "--group", group, "--topic", f"{topic}:1")
    assert rows(k) == rows(d) and rows(d)[-1] == [topic, "1", "Successful"]
    k, d = clusters.both("kafka-consumer-groups", "--describe", "--group", group, "--offsets")
    assert header_and_sorted_rows(k) == header_and_sorted_rows(d)
    assert [r[2:5] for r in header_and_sorted_rows(d)[1]] == [["0", "10", "10"], ["2", "10", "10"]]
    k, d = clusters.both("kafka-consumer-groups", "--delete", "--group", group)
    assert k == d == f"Deletion of requested consumer groups ('{group}') was successful.\n"
    k, d = clusters.both("kafka-consumer-groups", "--describe", "--group", group)
    assert k == d and f"GroupIdNotFoundException: Group {group} not found." in d


# ---- kafka-transactions ------------------------------------------------------------------------


def test_kafka_transactions_list_describe_producers_find_hanging(clusters: Clusters) -> None:
    topic = "tools-txn"
    open_producers = {}
    for target in TARGETS:
        clusters.run(target, "kafka-topics", "--create", "--topic", topic, "--partitions", "2",
                     "--replication-factor", "1")
        done = Producer({"bootstrap.servers": clusters.bootstrap(target), "transactional.id": "tools-committed",
                         "log_level": 2})
        done.init_transactions(WAIT_S)
        done.begin_transaction()
        for i in range(5):
            done.produce(topic, f"c{i}".encode(), partition=0)
        done.commit_transaction(WAIT_S)
        still = Producer({"bootstrap.servers": clusters.bootstrap(target), "transactional.id": "tools-open",
                          "log_level": 2})
        still.init_transactions(WAIT_S)
        still.begin_transaction()
        still.produce(topic, b"o", partition=1)
        assert still.flush(WAIT_S) == 0
        open_producers[target] = still
    try:
        ids = (r"(?m)^(\S+\s+)\d+(\s+)\d+", r"\1N\2N")  # coordinator, producer id
        k, d = clusters.both("kafka-transactions", "list")
        assert header_and_sorted_rows(subst(k, ids)) == header_and_sorted_rows(subst(d, ids))
        assert sorted(r[-1] for r in header_and_sorted_rows(d)[1]) == ["CompleteCommit", "Ongoing"]
        describe_rules = ((r"(?m)^\d+(\s+\S+\s+)\d+", r"C\1P"), (r"\b\d{10,}\b", "TIME"),
                          (r"(TIME\s+)\d+", r"\1DURATION"))
        for txn in ("tools-committed", "tools-open"):
            k, d = clusters.both("kafka-transactions", "describe", "--transactional-id", txn)
            assert rows(subst(k, *describe_rules)) == rows(subst(d, *describe_rules)), txn
        assert rows(d)[1][-1] == f"{topic}-1"
        for partition in ("0", "1"):
            k, d = clusters.both("kafka-transactions", "describe-producers", "--topic", topic, "--partition", partition)
            producer_rules = (r"(?m)^\d+", "P"), (r"\b\d{10,}\b", "TIME")
            assert rows(subst(k, *producer_rules)) == rows(subst(d, *producer_rules)), partition
        k, d = clusters.both("kafka-transactions", "find-hanging", "--broker-id", "1")
        assert k == d and len(rows(d)) == 1  # the header: nothing hangs
    finally:
        for p in open_producers.values():
            p.abort_transaction(WAIT_S)


# ---- kafka-delete-records, kafka-reassign-partitions, kafka-leader-election, kafka-log-dirs -

def reassignment_shape(text: str) -> list[str]:
    """Output lines with each JSON document reduced to its keys (partitions, replicas and
    directories depend on the cluster's size)."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            doc = json.loads(line)
            out.append(f"json {sorted(doc)} {sorted(doc['partitions'][0])}")
        else:
            out.append(subst(line, (r"brokers? [\d,]+", "brokers")))
    return out


def test_delete_records_reassign_elect_and_log_dirs(clusters: Clusters, tmp_path: Path) -> None:
    topic = "tools-moves"
    # dcmirror: replicas of partition 0 on brokers 1 and 2 (1 the preferred leader)
    clusters.run("dcmirror", "kafka-topics", "--create", "--topic", topic, "--replica-assignment", "1:2,2:3")
    clusters.run("kafka", "kafka-topics", "--create", "--topic", topic, "--partitions", "2", "--replication-factor", "1")
    for target in TARGETS:
        produce(clusters.bootstrap(target), topic, 10)  # one batch, offsets 0-9
    # the log start moves into that batch
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "offset": 5}]}))
    k, d = clusters.both("kafka-delete-records", "--offset-json-file", str(offsets))
    assert k == d == ("Executing records delete operation\nRecords delete operation completed:\n"
                      f"partition: {topic}-0\tlow_watermark: 5\n")

    moving = tmp_path / "topics.json"
    moving.write_text(json.dumps({"version": 1, "topics": [{"topic": topic}]}))
    k, d = clusters.both("kafka-reassign-partitions", "--generate", "--topics-to-move-json-file", str(moving),
                         "--broker-list", "1,2,3")
    assert reassignment_shape(k) == reassignment_shape(d)
    # partition 0 moves to [3, 1]: broker 3 copies a log that starts inside a batch; the
    # replication throttle is set while it does (and cleared by --verify)
    plans = {}
    for target, replicas in (("kafka", [1]), ("dcmirror", [3, 1])):
        plans[target] = tmp_path / f"plan-{target}.json"
        plans[target].write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": 0, "replicas": replicas, "log_dirs": ["any"] * len(replicas)}]}))
    k, d = (clusters.run(t, "kafka-reassign-partitions", "--execute", "--reassignment-json-file", str(plans[t]),
                         *THROTTLE) for t in TARGETS)
    assert reassignment_shape(k) == reassignment_shape(d)
    assert d.splitlines()[-1] == f"Successfully started partition reassignment for {topic}-0"

    def moved() -> bool:
        part = clusters.admin("dcmirror").list_topics(topic, timeout=10).topics[topic].partitions[0]
        return part.replicas == [3, 1] and sorted(part.isrs) == [1, 3]
    wait_for(moved, f"{topic}-0 on brokers [3, 1], both in sync")
    k, d = (clusters.run(t, "kafka-reassign-partitions", "--verify", "--reassignment-json-file", str(plans[t]))
            for t in TARGETS)
    assert reassignment_shape(k) == reassignment_shape(d)
    assert f"Reassignment of partition {topic}-0 is completed." in d.splitlines()
    k, d = clusters.both("kafka-reassign-partitions", "--list")
    assert k == d == "No partition reassignments found.\n"
    # the throttles are gone again
    k, d = clusters.both("kafka-configs", "--describe", "--entity-type", "brokers", "--entity-name", "1")
    assert k == d == "Dynamic configs for broker 1 are:\n"

    # broker 3 is now the preferred leader of partition 0
    elected = clusters.run("dcmirror", "kafka-leader-election", "--election-type", "preferred", "--topic", topic,
                           "--partition", "0")
    assert elected == f"Successfully completed leader election (PREFERRED) for partitions {topic}-0\n"
    k, d = clusters.both("kafka-leader-election", "--election-type", "preferred", "--topic", topic, "--partition", "0")
    assert k == d == f"Valid replica already elected for partitions {topic}-0\n"
    k, d = clusters.both("kafka-leader-election", "--election-type", "preferred", "--all-topic-partitions")
    assert k == d == ""
    described = clusters.run("dcmirror", "kafka-topics", "--describe", "--topic", topic)
    assert f"\tTopic: {topic}\tPartition: 0\tLeader: 3\tReplicas: 3,1\tIsr: " in described
    # the new leader serves the records from the log start on
    c = Consumer({"bootstrap.servers": clusters.dc.bootstrap, "group.id": f"tools-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 2})
    try:
        from confluent_kafka import TopicPartition
        c.assign([TopicPartition(topic, 0, -2)])
        got: list[tuple[int, bytes | None]] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 5 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append((m.offset(), m.value()))
        assert got == [(i, f"value-{i}".encode()) for i in range(5, 10)]
    finally:
        c.close()

    k, d = clusters.both("kafka-log-dirs", "--describe", "--topic-list", topic)
    assert k.splitlines()[0] == d.splitlines()[0] == "Querying brokers for log directories information"
    assert d.splitlines()[1] == "Received log directory information from brokers 1,2,3"
    kafka_doc, dc_doc = json.loads(k.splitlines()[2]), json.loads(d.splitlines()[2])
    assert sorted(dc_doc) == sorted(kafka_doc)
    held: dict[str, list[int]] = {}
    for b in dc_doc["brokers"]:
        (log_dir,) = b["logDirs"]
        assert sorted(log_dir) == sorted(kafka_doc["brokers"][0]["logDirs"][0])
        assert log_dir["error"] is None and log_dir["logDir"] == str(clusters.dc[b["broker"]].data_dir)
        for p in log_dir["partitions"]:
            assert sorted(p) == sorted(kafka_doc["brokers"][0]["logDirs"][0]["partitions"][0])
            held.setdefault(p["partition"], []).append(b["broker"])
    assert {p: sorted(bs) for p, bs in held.items()} == {f"{topic}-0": [1, 3], f"{topic}-1": [2, 3]}


# ---- kafka-features, kafka-metadata-quorum -------------------------------------------------

FEATURE_LINE = re.compile(r"Feature: (\S+)\s+SupportedMinVersion: (\S+)\s+SupportedMaxVersion: (\S+)\s+"
                          r"FinalizedVersionLevel: (\S+)\s+Epoch: (\d+)")


def test_kafka_features_describe(clusters: Clusters) -> None:
    k, d = clusters.both("kafka-features", "describe")
    kafka_features = {m.group(1): m.groups()[1:4] for m in map(FEATURE_LINE.fullmatch, k.splitlines()) if m}
    assert len(kafka_features) == len(k.splitlines())
    lines = d.splitlines()
    ours = [FEATURE_LINE.fullmatch(line) for line in lines]
    assert all(ours), lines
    # every feature dcmirror reports is one of Kafka's, at a level Kafka supports
    assert [m.group(1) for m in ours if m] == sorted(FEATURES) and set(FEATURES) <= set(kafka_features)
    for m in ours:
        assert m is not None
        name, low, high, level = m.groups()[:4]
        if name == "metadata.version":
            assert (low, high, level) == ("3.9-IV0", "3.9-IV0", "3.9-IV0")
        else:
            assert int(kafka_features[name][0]) <= int(low) <= int(level) <= int(high) <= int(kafka_features[name][1])
    # the column layout is Kafka's: a feature both report alike is the same line but its epoch
    same = [[subst(line, (r"Epoch: \d+", "Epoch: E")) for line in text.splitlines() if "group.version" in line]
            for text in (k, d)]
    assert same[0] == same[1] and len(same[1]) == 1


def test_kafka_metadata_quorum_describe(clusters: Clusters) -> None:
    k, d = clusters.both("kafka-metadata-quorum", "describe", "--status")
    keys = [[line.split(":", 1)[0] for line in text.splitlines()] for text in (k, d)]
    assert keys[0] == keys[1] == ["ClusterId", "LeaderId", "LeaderEpoch", "HighWatermark", "MaxFollowerLag",
                                  "MaxFollowerLagTimeMs", "CurrentVoters", "CurrentObservers"]
    status = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in d.splitlines()}
    assert status["ClusterId"] == clusters.dc.name and int(status["LeaderId"]) in clusters.dc.brokers
    assert int(status["HighWatermark"]) > 0 and status["CurrentObservers"] == "[]"
    assert json.loads(status["CurrentVoters"]) == [
        {"id": i, "endpoints": [f"PLAINTEXT://{b.bootstrap}"]} for i, b in sorted(clusters.dc.brokers.items())]
    kafka_voters = json.loads(dict(line.split(":", 1) for line in k.splitlines())["CurrentVoters"])
    assert [sorted(v) for v in kafka_voters] == [["endpoints", "id"]]

    k, d = clusters.both("kafka-metadata-quorum", "describe", "--replication")
    assert rows(k)[0] == rows(d)[0] == ["NodeId", "DirectoryId", "LogEndOffset", "Lag", "LastFetchTimestamp",
                                        "LastCaughtUpTimestamp", "Status"]
    assert [r[1:] for r in rows(k)[1:]][0][-1] == "Leader"
    table = rows(d)[1:]
    assert sorted(r[-1] for r in table) == ["Follower", "Follower", "Leader"] and table[0][-1] == "Leader"
    assert {int(r[0]) for r in table} == set(clusters.dc.brokers)
    leader_end = int(table[0][2])
    for node, directory, end, lag, fetched, caught_up, _ in table:
        assert directory == "AAAAAAAAAAAAAAAAAAAAAA" and int(lag) == leader_end - int(end) >= 0
        assert int(fetched) >= int(caught_up) > 1_600_000_000_000, node
    human = clusters.run("dcmirror", "kafka-metadata-quorum", "describe", "--replication", "--human-readable")
    for line in human.strip().splitlines()[1:]:
        assert re.fullmatch(r"\d+\s+A+\s+\d+\s+\d+\s+\d+ ms ago\s+\d+ ms ago\s+(Leader|Follower)\s*", line), line


# ---- kafka-producer-perf-test, kafka-consumer-perf-test ------------------------------------

PRODUCER_SUMMARY = re.compile(r"2000 records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, "
                              r"[\d.]+ ms max latency, \d+ ms 50th, \d+ ms 95th, \d+ ms 99th, \d+ ms 99\.9th\.")
CONSUMER_HEADER = ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
                   "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")


def test_kafka_perf_tests(clusters: Clusters) -> None:
    for target in TARGETS:
        clusters.run(target, "kafka-topics", "--create", "--topic", "tools-perf", "--partitions", "2",
                     "--replication-factor", "1")
    k, d = clusters.both("kafka-producer-perf-test", "--topic", "tools-perf", "--num-records", "2000",
                         "--record-size", "100", "--throughput", "-1", "--command-property", "acks=all")
    for out in (k, d):
        assert PRODUCER_SUMMARY.fullmatch(out.splitlines()[-1]), out
    k, d = clusters.both("kafka-consumer-perf-test", "--topic", "tools-perf", "--num-records", "2000",
                         "--timeout", "60000")
    for out in (k, d):
        header, data = out.strip().splitlines()[-2:]
        assert header == CONSUMER_HEADER
        cells = [c.strip() for c in data.split(",")]
        assert len(cells) == 10 and cells[2] == "0.1907" and cells[4] == "2000", out

