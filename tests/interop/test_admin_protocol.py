"""Admin and group APIs everyday Kafka tools call, with librdkafka's and kafka-python's admin
clients against a real broker: OffsetDelete (47), ListGroups v4–v5 filters (KIP-518,
KIP-848's group types), DescribeLogDirs (35) against the bytes on disk."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState, ConsumerGroupType, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import errors as kp_errors
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.structs import TopicPartition as KpTopicPartition

from tests.harness import BrokerProcess
from tests.interop.clients import ck_consumer, ck_produce
from tests.interop.common import Rec, segment_files, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def kp(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    client.create_topics([NewTopic("a", 2, 1), NewTopic("b", 1, 1)])
    yield client
    client.close()


def _commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """A simple (assign-mode) group's commit: no JoinGroup, the group stays Empty."""
    consumer = ck_consumer(bootstrap, {"group.id": group})
    try:
        done = consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                               asynchronous=False)
        assert all(tp.error is None for tp in done), done
    finally:
        consumer.close()


def _offsets(kp: KafkaAdminClient, group: str) -> dict[tuple[str, int], int]:
    return {(tp.topic, tp.partition): m.offset for tp, m in kp.list_group_offsets(group)[group].items()}


def _subscribed(bootstrap: str, group: str, topic: str) -> Any:
    """A live member of `group` (Stable, protocol type consumer) subscribed to `topic`."""
    consumer = ck_consumer(bootstrap, {"group.id": group, "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment():
        assert time.monotonic() < deadline, "no assignment within 30 s"
        consumer.poll(0.2)
    return consumer


def test_offset_delete_as_kafka_answers_it(broker: BrokerProcess, kp: KafkaAdminClient) -> None:
    _commit(broker.bootstrap, "simple-g", {("a", 0): 5, ("a", 1): 7, ("b", 0): 3})
    answer = kp.delete_group_offsets("simple-g", [KpTopicPartition("a", 0), KpTopicPartition("b", 0),
                                                  KpTopicPartition("zz", 0)])
    assert {(tp.topic, tp.partition): e for tp, e in answer.items()} == {
        ("a", 0): kp_errors.NoError, ("b", 0): kp_errors.NoError,
        ("zz", 0): kp_errors.UnknownTopicOrPartitionError}, answer
    assert _offsets(kp, "simple-g") == {("a", 1): 7}

    # a live consumer group: offsets of the topics its members subscribe to stay
    member = _subscribed(broker.bootstrap, "live-g", "a")
    try:
        done = member.commit(offsets=[TopicPartition("a", 0, 11), TopicPartition("b", 0, 4)], asynchronous=False)
        assert all(tp.error is None for tp in done), done
        answer = kp.delete_group_offsets("live-g", [KpTopicPartition("a", 0), KpTopicPartition("b", 0)])
        assert {(tp.topic, tp.partition): e for tp, e in answer.items()} == {
            ("a", 0): kp_errors.GroupSubscribedToTopicError, ("b", 0): kp_errors.NoError}, answer
        assert _offsets(kp, "live-g") == {("a", 0): 11}

        # -- ListGroups v4/v5 filters while one group is Stable and one Empty
        def listed(**filters: Any) -> set[tuple[str, str, str]]:
            return {(g["group_id"], g["group_state"], g["group_type"]) for g in kp.list_groups(**filters)}

        wait_until(lambda: listed(states_filter=["Stable"]) == {("live-g", "Stable", "classic")}, 15,
                   what="live-g Stable")
        assert listed() == {("live-g", "Stable", "classic"), ("simple-g", "Empty", "classic")}
        assert listed(states_filter=["empty"]) == {("simple-g", "Empty", "classic")}  # case-insensitive
        assert listed(states_filter=["Dead"]) == set()
        assert listed(types_filter=["Classic"]) == listed()
        assert listed(types_filter=["consumer"]) == set()
        ck = AdminClient({"bootstrap.servers": broker.bootstrap})
        found = ck.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(15)
        assert [(g.group_id, g.state, g.type) for g in found.valid] == \
            [("live-g", ConsumerGroupState.STABLE, ConsumerGroupType.CLASSIC)], found.errors
        assert ck.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(15).valid == []
    finally:
        member.close()

    # after the member left the group is Empty: everything may go
    wait_until(lambda: [g["group_state"] for g in kp.list_groups() if g["group_id"] == "live-g"] == ["Empty"], 15,
               what="live-g Empty")
    answer = kp.delete_group_offsets("live-g", [KpTopicPartition("a", 0)])
    assert list(answer.values()) == [kp_errors.NoError], answer
    assert _offsets(kp, "live-g") == {}

    with pytest.raises(kp_errors.GroupIdNotFoundError):
        kp.delete_group_offsets("no-such-group", [KpTopicPartition("a", 0)])

    # survives a restart: the tombstones are in __consumer_offsets
    broker.stop()
    broker.start()
    kp2 = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        assert wait_until(lambda: _offsets(kp2, "simple-g") == {("a", 1): 7}, 30, what="offsets after restart")
    finally:
        kp2.close()


def test_describe_log_dirs_reports_the_bytes_on_disk(broker: BrokerProcess, kp: KafkaAdminClient) -> None:
    ck_produce(broker.bootstrap, "a", [Rec(i % 2, None, b"v" * (100 + i), (), 0) for i in range(200)],
               flush_every=20)
    (doc,) = kp.describe_log_dirs()
    assert doc["broker"] == 1
    (log_dir,) = doc["log_dirs"]
    assert log_dir["error_code"] == 0 and log_dir["log_dir"] == str(broker.data_dir.resolve())
    assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
    sizes = {(t["name"], p["partition_index"]): (p["partition_size"], p["offset_lag"])
             for t in log_dir["topics"] for p in t["partitions"]}
    for key in (("a", 0), ("a", 1), ("b", 0)):
        on_disk = sum(f.stat().st_size for f in segment_files(broker.data_dir, *key))
        assert sizes[key] == (on_disk, 0), (key, sizes[key], on_disk)
    assert sizes[("a", 0)][0] > 100 * 100 and sizes[("b", 0)][0] == 0
    # only what was asked
    (doc,) = kp.describe_log_dirs({"a": [1]})
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in doc["log_dirs"][0]["topics"]] == \
        [("a", [1])]


def test_the_cli_deletes_records_and_offsets_and_shows_log_dirs(broker: BrokerProcess, kp: KafkaAdminClient) -> None:
    """`dcmirror topics delete-records`, `groups delete-offsets`, `log-dirs` (kafka-delete-records,
    kafka-consumer-groups --delete-offsets, kafka-log-dirs)."""
    import json

    from tests.deploy.conftest import dcmirror
    from tests.interop.clients import ck_watermarks

    ck_produce(broker.bootstrap, "b", [Rec(0, None, f"r{i}".encode(), (), 0) for i in range(50)], flush_every=10)
    out = dcmirror("topics", "delete-records", "b", "--offset", "20", "--bootstrap", broker.bootstrap)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "b-0: records below 20 deleted (low watermark 20)"
    assert ck_watermarks(broker.bootstrap, "b", 1) == {0: (20, 50)}
    out = dcmirror("topics", "delete-records", "b", "--offset", "51", "--bootstrap", broker.bootstrap)
    assert out.returncode == 2 and "OFFSET_OUT_OF_RANGE" in out.stderr, (out.stdout, out.stderr)

    _commit(broker.bootstrap, "cli-g", {("b", 0): 30, ("a", 1): 4})
    out = dcmirror("groups", "--bootstrap", broker.bootstrap, "delete-offsets", "cli-g", "--topic", "b")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[1].split() == ["b", "0", "deleted"], out.stdout
    assert _offsets(kp, "cli-g") == {("a", 1): 4}

    out = dcmirror("log-dirs", "--bootstrap", broker.bootstrap, "--topic", "b", "--json")
    assert out.returncode == 0, out.stderr
    (doc,) = json.loads(out.stdout)["brokers"]
    on_disk = sum(f.stat().st_size for f in segment_files(broker.data_dir, "b", 0))
    assert doc["broker"] == 1 and doc["partitions"] == [
        {"topic": "b", "partition": 0, "size_bytes": on_disk, "offset_lag": 0}], doc


def test_describe_topic_partitions_pages_with_a_cursor(broker: BrokerProcess, kp: KafkaAdminClient) -> None:
    """DescribeTopicPartitions (75) as Kafka 3.9 answers it: name order, at most the limit
    per answer, next_cursor where the next starts; errors per topic; a foreign cursor refused."""
    from cluster.client.sync import SyncAdmin
    from cluster.protocol.api_keys import ApiKey
    from cluster.protocol.errors import ErrorCode

    kp.create_topics([NewTopic("c", 5, 1)])
    with SyncAdmin(broker.bootstrap) as admin:
        pages: list[tuple[list[tuple[str, list[int]]], Any]] = []
        cursor = None
        for _ in range(10):  # three pages are expected; a cursor that does not advance fails below
            resp = admin.raw(ApiKey.DESCRIBE_TOPIC_PARTITIONS, {
                "topics": [{"name": n} for n in ("c", "a", "b")], "response_partition_limit": 3, "cursor": cursor})
            pages.append(([(t.name, [p.partition_index for p in t.partitions]) for t in resp.topics],
                          resp.next_cursor and (resp.next_cursor.topic_name, resp.next_cursor.partition_index)))
            if resp.next_cursor is None:
                break
            cursor = {"topic_name": resp.next_cursor.topic_name, "partition_index": resp.next_cursor.partition_index}
        assert pages == [([("a", [0, 1]), ("b", [0])], ("c", 0)),
                         ([("c", [0, 1, 2])], ("c", 3)),
                         ([("c", [3, 4])], None)], pages
        whole = admin.describe_topic_partitions(["c", "missing", "a"], partitions_per_request=2)
        assert [(t["name"], t["error_code"], [p["partition"] for p in t["partitions"]]) for t in whole] == [
            ("a", 0, [0, 1]), ("c", 0, [0, 1, 2, 3, 4]), ("missing", ErrorCode.unknown_topic_or_partition, [])]
        assert all(p["leader"] == 1 and p["replicas"] == [1] and p["isr"] == [1] for p in whole[1]["partitions"])
        assert whole[0]["topic_id"].int != 0 and whole[2]["topic_id"] is None  # kio: the zero uuid is None
        everything = admin.describe_topic_partitions()
        assert [t["name"] for t in everything] == sorted(t["name"] for t in everything) and \
            {"a", "b", "c"} <= {t["name"] for t in everything}
        refused = admin.raw(ApiKey.DESCRIBE_TOPIC_PARTITIONS, {
            "topics": [{"name": "a"}], "response_partition_limit": 10, "cursor": {"topic_name": "b", "partition_index": 0}})
        assert [(t.name, t.error_code) for t in refused.topics] == [("a", ErrorCode.invalid_request)]


def test_create_topics_v7_returns_the_configs_and_describe_configs_v4_the_types(broker: BrokerProcess) -> None:
    """What the Java Admin client reads (tests/kafka/test_java_clients.py compares it with
    Kafka): CreateTopics v5+ hands back the new topic's configs in force (KIP-525;
    CreateTopicsResult.config() is UnsupportedVersionException below v5) and v7 its id;
    DescribeConfigs v3+ each config's type (ConfigEntry.type(), UNKNOWN below v3)."""
    import uuid

    import trio

    from cluster.client.connection import BrokerConnection
    from cluster.protocol.api_keys import ApiKey

    async def ask() -> tuple[Any, Any]:
        host, port = broker.bootstrap.split(":")
        conn = await BrokerConnection(host, int(port), client_id="admin-v7").connect()
        try:
            created = await conn.request(ApiKey.CREATE_TOPICS, {
                "topics": [{"name": "typed", "num_partitions": 2, "replication_factor": 1, "assignments": [],
                            "configs": [{"name": "retention.ms", "value": "3600000"}]}],
                "timeout": 30_000, "validate_only": False}, version=7)
            described = await conn.request(ApiKey.DESCRIBE_CONFIGS, {
                "resources": [{"resource_type": 2, "resource_name": "typed",
                               "configuration_keys": ["retention.ms", "segment.bytes", "cleanup.policy"]},
                              {"resource_type": 4, "resource_name": "1", "configuration_keys": ["ssl.key.password"]}],
                "include_synonyms": False, "include_documentation": True}, version=4)
        finally:
            await conn.aclose()
        return created, described

    created, described = trio.run(ask)
    (topic,) = created.topics
    assert topic.error_code == 0 and topic.num_partitions == 2 and topic.replication_factor == 1
    assert topic.topic_id not in (None, uuid.UUID(int=0))
    configs = {c.name: (c.value, c.config_source, c.read_only, c.is_sensitive) for c in topic.configs}
    assert configs["retention.ms"] == ("3600000", 1, False, False)  # DYNAMIC_TOPIC_CONFIG
    assert configs["segment.bytes"] == ("1073741824", 5, False, False)  # DEFAULT_CONFIG
    assert len(configs) > 30
    types = {c.name: c.config_type for r in described.results for c in r.configs}
    assert types == {"retention.ms": 5, "segment.bytes": 3, "cleanup.policy": 7, "ssl.key.password": 9}  # LONG INT LIST PASSWORD
    assert all(c.documentation for r in described.results for c in r.configs)
