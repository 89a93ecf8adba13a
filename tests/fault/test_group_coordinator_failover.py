"""A consumer group on a 3-broker cluster when its coordinator is killed.

The coordinator is the leader of the group's `__consumer_offsets` partition (RF 3); its
followers hold the committed offsets, so the next leader coordinates the group with them.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cluster.groups.records import partition_for
from tests.harness import ClusterProcesses

TOPIC, GROUP, RECORDS = "clicks", "click-counter", 300


def coordinator(admin: AdminClient) -> int:
    md = admin.list_topics("__consumer_offsets", timeout=10)
    return int(md.topics["__consumer_offsets"].partitions[partition_for(GROUP, 50)].leader)


def test_group_survives_kill9_of_its_coordinator(cluster_factory: object) -> None:
    cluster: ClusterProcesses = cluster_factory(3)  # type: ignore[operator]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 3, 3)])[TOPIC].result(30)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"%d" % i, partition=i % 3)
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": GROUP,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": 6000, "fetch.queue.backoff.ms": 10})
    consumer.subscribe([TOPIC])
    got: list[int] = []
    deadline = time.monotonic() + 30
    while len(got) < RECORDS // 2 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(int(msg.value()))
    consumer.commit(asynchronous=False)
    before = {tp.partition: tp.offset for tp in consumer.committed(
        [TopicPartition(TOPIC, p) for p in range(3)], timeout=10)}
    assert sum(max(0, o) for o in before.values()) == len(got)

    old = coordinator(admin)
    time.sleep(1.0)  # followers fetch the offsets records (acks=all for them arrives with issue 5)
    cluster[old].kill9()
    deadline = time.monotonic() + 60
    while len(got) < RECORDS and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(int(msg.value()))
    consumer.commit(asynchronous=False)
    after = {tp.partition: tp.offset for tp in consumer.committed(
        [TopicPartition(TOPIC, p) for p in range(3)], timeout=10)}
    consumer.close()

    survivors = AdminClient({"bootstrap.servers": cluster.bootstrap_of(*(i for i in (1, 2, 3) if i != old))})
    assert coordinator(survivors) != old
    # Everything read exactly once across the failover, and the group's offsets are complete.
    assert sorted(got) == list(range(RECORDS)), cluster.logs()
    assert after == {0: 100, 1: 100, 2: 100}
