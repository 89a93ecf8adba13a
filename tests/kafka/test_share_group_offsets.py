"""A share group's offsets (KIP-932: DescribeShareGroupOffsets, AlterShareGroupOffsets,
DeleteShareGroupOffsets) against a dcmirror broker process, with Kafka 4.3.1's own
kafka-share-groups, `dcmirror share-groups` and confluent-kafka's ShareConsumer: the start
offset described once records are accepted, a reset refused while a member is in and, once
the group is empty, a new member reading exactly the records from the reset offset; deleted
offsets no longer described; a deleted and re-created share group starting afresh. The same
admin answers are compared with a Kafka 4.3.1 broker's."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from cluster.protocol.messages import decode_response, encode_request
from tests.cluster_helpers import wait_until
from tests.harness import REPO, BrokerProcess
from tests.peers.kafka import KafkaCluster, run_tool

pytestmark = pytest.mark.timeout(300)
SHARE_GROUPS_TOOL = "org.apache.kafka.tools.consumer.group.ShareGroupCommand"
PROGRESS_S = 60.0  # the longest a step may go without progress
DESCRIBE_OFFSETS, ALTER_OFFSETS, DELETE_OFFSETS, SHARE_GROUP_DESCRIBE = 90, 91, 92, 77
NONE, UNKNOWN_TOPIC_OR_PARTITION, GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP = 0, 3, 69, 68
RETRIABLE = {14, 15, 16}  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR
ZERO_UUID = uuid.UUID(int=0)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("share-offsets") / "broker", group_initial_rebalance_delay_ms=0).start()
    try:
        yield b
    finally:
        b.stop()


def tool(broker: str, cwd: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = run_tool(SHARE_GROUPS_TOOL, "--bootstrap-server", broker, *args, cwd=cwd)
    if ok:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def dcmirror(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", "share-groups", "--bootstrap", broker.bootstrap,
                           *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def call(bootstrap: str, api: int, version: int, body: dict[str, Any]) -> Any:
    """One request to the (single) broker, answered once its coordinators are loaded."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)

    def once() -> Any:
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(encode_request(api, version, 1, b"share-offsets-test", body))
            (length,) = struct.unpack(">i", _read(s, 4))
            resp = decode_response(api, version, _read(s, length))
        codes = [g.error_code for g in resp.groups] if api in (DESCRIBE_OFFSETS, SHARE_GROUP_DESCRIBE) \
            else [resp.error_code]
        return None if set(codes) & RETRIABLE else resp
    return wait_until(once, PROGRESS_S, f"API {api} answered by a loaded coordinator")


def coordinator_ready(bootstrap: str, group: str) -> None:
    """FindCoordinator until it answers (Kafka creates `__consumer_offsets` on the first one)."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)

    def found() -> bool:
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(encode_request(10, 2, 1, b"share-offsets-test", {"key": group, "key_type": 0}))
            (length,) = struct.unpack(">i", _read(s, 4))
            return decode_response(10, 2, _read(s, length)).error_code == NONE
    wait_until(found, PROGRESS_S, f"the coordinator of {group}")


def _read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "closed"
        out += chunk
    return out


def offsets(bootstrap: str, group: str, topics: dict[str, list[int]] | None = None) -> list[tuple[Any, ...]]:
    """DescribeShareGroupOffsets v1: (topic, partition, start offset, lag, error) sorted."""
    asked = None if topics is None else [{"topic_name": t, "partitions": ps} for t, ps in topics.items()]
    (g,) = call(bootstrap, DESCRIBE_OFFSETS, 1, {"groups": [{"group_id": group, "topics": asked}]}).groups
    assert g.error_code == NONE, g
    return sorted((t.topic_name, p.partition_index, p.start_offset, p.lag, p.error_code)
                  for t in g.topics for p in t.partitions)


def alter(bootstrap: str, group: str, topic: str, starts: dict[int, int]) -> Any:
    return call(bootstrap, ALTER_OFFSETS, 0, {"group_id": group, "topics": [
        {"topic_name": topic, "partitions": [{"partition_index": p, "start_offset": o} for p, o in starts.items()]}]})


def delete_offsets(bootstrap: str, group: str, topics: list[str]) -> Any:
    return call(bootstrap, DELETE_OFFSETS, 0, {"group_id": group, "topics": [{"topic_name": t} for t in topics]})


def setup_topic(bootstrap: str, topic: str, partitions: int, *, earliest_group: str | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    if earliest_group is not None:  # the group's share partitions start at the log's start
        resource = ConfigResource(ResourceType.GROUP, earliest_group, incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(30)


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    for v in values:
        p.produce(topic, v.encode(), partition=0)
    assert p.flush(30) == 0


def member(bootstrap: str, group: str, topic: str) -> ShareConsumer:
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    c.subscribe([topic])
    return c


def receive(c: ShareConsumer, count: int) -> list[str]:
    """Values polled (implicit acknowledgement: each poll accepts the last one's records)
    until `count` arrived; fails when PROGRESS_S pass without a record."""
    got: list[str] = []
    last = time.monotonic()
    while len(got) < count:
        for m in c.poll(0.3):
            if m.error() is None:
                got.append(m.value().decode())
                last = time.monotonic()
        assert time.monotonic() - last < PROGRESS_S, f"{len(got)} of {count} records arrived: {got}"
    return got


def accepted(bootstrap: str, c: ShareConsumer, group: str, topic: str, start: int) -> None:
    """Polls (sending the acceptances) until the group's start offset is `start`."""
    def settled() -> bool:
        c.poll(0.2)
        return offsets(bootstrap, group, {topic: [0]})[0][2] == start
    wait_until(settled, PROGRESS_S, f"{group}'s start offset at {start}")


def rows(out: str, group: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.split()[:1] == [group]]


def test_offsets_described_reset_while_empty_then_read_again_and_deleted(broker: BrokerProcess,
                                                                          tmp_path: Path) -> None:
    topic, group = "so-topic", "so-group"
    values = [f"r-{i}" for i in range(10)]
    setup_topic(broker.bootstrap, topic, 1, earliest_group=group)
    produce(broker.bootstrap, topic, values)
    c = member(broker.bootstrap, group, topic)
    closed = False
    try:
        assert sorted(receive(c, 10), key=lambda v: int(v[2:])) == values
        accepted(broker.bootstrap, c, group, topic, 10)
        # every record accepted: start offset 10, nothing left (lag 0)
        assert offsets(broker.bootstrap, group) == [(topic, 0, 10, 0, NONE)]
        described = tool(broker.bootstrap, tmp_path, "--describe", "--offsets", "--group", group).stdout
        assert rows(described, group) == [[group, topic, "0", "10", "0"]], described
        mine = dcmirror(broker, "describe", group, "--offsets")
        assert mine.returncode == 0 and rows(mine.stdout, group) == [[group, topic, "0", "10", "0"]], mine
        # a member is in: every way of altering is refused, nothing moves
        assert alter(broker.bootstrap, group, topic, {0: 0}).error_code == NON_EMPTY_GROUP
        refused = tool(broker.bootstrap, tmp_path, "--reset-offsets", "--to-earliest", "--execute", "--group", group,
                       "--topic", topic, ok=False)
        assert refused.returncode != 0 and f"Share group '{group}' is not empty." in refused.stdout + refused.stderr
        mine = dcmirror(broker, "reset-offsets", group, "--topic", topic, "--to-earliest", "--execute")
        assert mine.returncode == 1 and "has 1 member(s)" in mine.stderr, mine
        assert delete_offsets(broker.bootstrap, group, [topic]).error_code == NON_EMPTY_GROUP
        assert offsets(broker.bootstrap, group) == [(topic, 0, 10, 0, NONE)]
        c.close()
        closed = True
    finally:
        if not closed:
            c.close()
    wait_until(lambda: "Empty" in dcmirror(broker, "describe", group, "--state").stdout, PROGRESS_S,
               "the share group empty once its member left")
    # empty: kafka-share-groups resets it to the log's start
    done = tool(broker.bootstrap, tmp_path, "--reset-offsets", "--to-earliest", "--execute", "--group", group,
                "--topic", topic)
    assert rows(done.stdout, group) == [[group, topic, "0", "0"]], done.stdout
    assert offsets(broker.bootstrap, group) == [(topic, 0, 0, 10, NONE)]  # nothing settled from 0: lag 10
    # dcmirror's own resets: a dry run moves nothing; --to-offset, --by-duration
    dry = dcmirror(broker, "reset-offsets", group, "--all-topics", "--to-latest")
    assert dry.returncode == 0 and rows(dry.stdout, group) == [[group, topic, "0", "0", "10"]], dry
    assert offsets(broker.bootstrap, group) == [(topic, 0, 0, 10, NONE)]
    moved = dcmirror(broker, "reset-offsets", group, "--topic", topic, "--to-offset", "4", "--execute")
    assert moved.returncode == 0, moved
    assert offsets(broker.bootstrap, group) == [(topic, 0, 4, 6, NONE)]
    moved = dcmirror(broker, "reset-offsets", group, "--topic", f"{topic}:0", "--by-duration", "PT1H", "--execute")
    assert moved.returncode == 0 and rows(moved.stdout, group) == [[group, topic, "0", "4", "0"]], moved
    # a new member reads exactly the records from the reset offset, each once
    c = member(broker.bootstrap, group, topic)
    try:
        assert sorted(receive(c, 10), key=lambda v: int(v[2:])) == values
        accepted(broker.bootstrap, c, group, topic, 10)
        assert not [m for m in c.poll(1.0) if m.error() is None]  # nothing more
    finally:
        c.close()
    wait_until(lambda: "Empty" in dcmirror(broker, "describe", group, "--state").stdout, PROGRESS_S,
               "the share group empty again")
    # deleted offsets are described no more
    gone = tool(broker.bootstrap, tmp_path, "--delete-offsets", "--group", group, "--topic", topic)
    assert [topic, "Successful"] in [line.split() for line in gone.stdout.splitlines()], gone.stdout
    assert offsets(broker.bootstrap, group) == []
    assert offsets(broker.bootstrap, group, {topic: [0]}) == [(topic, 0, -1, -1, NONE)]
    again = delete_offsets(broker.bootstrap, group, [topic])
    assert [(t.topic_name, t.error_code, t.error_message) for t in again.responses] == [
        (topic, UNKNOWN_TOPIC_OR_PARTITION, "There is no offset information to delete.")]
    described = tool(broker.bootstrap, tmp_path, "--describe", "--offsets", "--group", group).stdout
    assert rows(described, group) == [], described


def test_a_deleted_and_recreated_share_group_starts_afresh(broker: BrokerProcess, tmp_path: Path) -> None:
    topic, group = "so-recreated", "so-recreated-group"
    setup_topic(broker.bootstrap, topic, 1)
    c = member(broker.bootstrap, group, topic)
    try:  # share.auto.offset.reset latest: the share partition starts where the log ends when first fetched
        def started() -> bool:
            c.poll(0.2)
            return offsets(broker.bootstrap, group, {topic: [0]})[0][2] == 0
        wait_until(started, PROGRESS_S, "the share partition started at the empty log's end")
        produce(broker.bootstrap, topic, ["a-0", "a-1", "a-2", "a-3", "a-4"])
        assert sorted(receive(c, 5)) == ["a-0", "a-1", "a-2", "a-3", "a-4"]
        accepted(broker.bootstrap, c, group, topic, 5)
    finally:
        c.close()
    wait_until(lambda: "Empty" in dcmirror(broker, "describe", group, "--state").stdout, PROGRESS_S,
               "the share group empty once its member left")
    tool(broker.bootstrap, tmp_path, "--delete", "--group", group)
    # its state went with it
    assert offsets(broker.bootstrap, group, {topic: [0]}) == [(topic, 0, -1, -1, NONE)]
    produce(broker.bootstrap, topic, ["b-5", "b-6", "b-7"])
    c = member(broker.bootstrap, group, topic)
    try:  # the new group starts at the end (8), not where the old one stopped (5)
        def restarted() -> bool:
            c.poll(0.2)
            return offsets(broker.bootstrap, group, {topic: [0]})[0][2] == 8
        wait_until(restarted, PROGRESS_S, "the new share group started at the log's end")
        produce(broker.bootstrap, topic, ["c-8", "c-9"])
        assert sorted(receive(c, 2)) == ["c-8", "c-9"]
    finally:
        c.close()


def admin_answers(bootstrap: str, topic: str, other: str, group: str) -> dict[str, Any]:
    """The admin answers compared between dcmirror and Kafka: an alter of a group that does
    not exist (it makes an empty share group), describes named and all, an unknown topic,
    an out-of-range partition, deletes of offsets never initialized, of no group, and real."""
    out: dict[str, Any] = {}
    coordinator_ready(bootstrap, group)
    a = alter(bootstrap, group, topic, {0: 3, 7: 1})
    out["alter"] = (a.error_code, sorted((t.topic_name, p.partition_index, p.error_code) for t in a.responses
                                         for p in t.partitions))
    (g,) = call(bootstrap, SHARE_GROUP_DESCRIBE, 1, {"group_ids": [group], "include_authorized_operations": False}
                ).groups
    out["made"] = (g.error_code, g.group_state, len(g.members))
    out["named"] = offsets(bootstrap, group, {topic: [0], "no-such-topic": [0]})
    out["all"] = offsets(bootstrap, group)
    d = delete_offsets(bootstrap, group, [other, "no-such-topic"])
    out["delete never initialized"] = (d.error_code, sorted((t.topic_name, t.error_code, t.error_message)
                                                            for t in d.responses))
    out["delete no group"] = delete_offsets(bootstrap, "no-such-group", [topic]).error_code
    d = delete_offsets(bootstrap, group, [topic])
    out["delete"] = (d.error_code, [(t.topic_name, t.error_code) for t in d.responses])
    out["all after"] = offsets(bootstrap, group)
    return out


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka") / "kafka", size=1).start()
    yield cluster
    cluster.stop()


def test_admin_answers_are_kafka_4_3_1s(broker: BrokerProcess, kafka: KafkaCluster) -> None:
    seen = {}
    for name, bootstrap in (("dcmirror", broker.bootstrap), ("kafka", kafka.bootstrap)):
        setup_topic(bootstrap, "cmp-topic", 1)
        setup_topic(bootstrap, "cmp-other", 1)
        produce(bootstrap, "cmp-topic", [f"x-{i}" for i in range(5)])
        seen[name] = admin_answers(bootstrap, "cmp-topic", "cmp-other", "cmp-group")
    assert seen["dcmirror"] == seen["kafka"]
    assert seen["dcmirror"]["named"] == [("cmp-topic", 0, 3, 2, NONE), ("no-such-topic", 0, -1, -1, NONE)]


def find_coordinator(bootstrap: str, version: int, body: dict[str, Any]) -> Any:
    host, port = bootstrap.rsplit(":", 1)

    def once() -> Any:
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(encode_request(10, version, 1, b"share-offsets-test", body))
            (length,) = struct.unpack(">i", _read(s, 4))
            resp = decode_response(10, version, _read(s, length))
        codes = [c.error_code for c in resp.coordinators] if version >= 4 else [resp.error_code]
        return None if set(codes) & RETRIABLE else resp
    return wait_until(once, PROGRESS_S, f"FindCoordinator v{version} answered")


def test_find_coordinator_batches_keys_and_finds_share_coordinators(broker: BrokerProcess) -> None:
    share_key = f"so-share-group:{uuid.uuid4()}:0"
    resp = find_coordinator(broker.bootstrap, 6, {"key_type": 2, "coordinator_keys": [share_key, "no-partition"]})
    found = {c.key: (c.error_code, c.node_id) for c in resp.coordinators}
    assert found == {share_key: (NONE, 1), "no-partition": (42, -1)}  # INVALID_REQUEST: not group:topicId:partition
    resp = find_coordinator(broker.bootstrap, 4, {"key_type": 0, "coordinator_keys": ["so-a", "so-b", "so-a"]})
    assert sorted((c.key, c.error_code, c.node_id) for c in resp.coordinators) == [("so-a", 0, 1), ("so-b", 0, 1)]
    assert find_coordinator(broker.bootstrap, 3, {"key": share_key, "key_type": 2}).error_code == 42  # v6+ only
