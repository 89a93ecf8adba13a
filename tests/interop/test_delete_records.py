"""DeleteRecords (API 21) with librdkafka's and kafka-python's admin clients against a real
3-broker cluster at RF 3: the log start moves on every replica, segments wholly below it
leave every broker's disk, reads below it get OFFSET_OUT_OF_RANGE, and it all survives a
kill -9 of the whole cluster and a leader change. Error answers as Kafka gives them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from tests.cluster_helpers import admin, metadata, partitions_of, topic_ready, wait_until
from tests.harness import ClusterProcesses
from tests.interop.clients import ck_consume, ck_consumer, ck_produce, ck_watermarks
from tests.interop.common import Rec

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

TOPIC = "purge"
PER_PARTITION = 300
SEGMENT_BYTES = 4000  # ~30 records of 100 B per segment: DeleteRecords frees whole segments


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterProcesses]:
    c = ClusterProcesses(tmp_path / "c", 3, **{"broker.session.timeout.ms": 2000}).start()
    yield c
    c.stop()


def _records() -> list[Rec]:
    return [Rec(p, f"k{i}".encode(), f"p{p}-{i:04d}-".encode() + b"x" * 90, (), 0)
            for i in range(PER_PARTITION) for p in (0, 1)]


def _segment_bases(cluster: ClusterProcesses, node: int, partition: int) -> list[int]:
    directory = cluster[node].data_dir / f"{TOPIC}-{partition}"
    return sorted(int(p.stem) for p in directory.glob("*.log"))


def _delete_with_librdkafka(bootstrap: str, wanted: list[TopicPartition]) -> dict[int, object]:
    """partition → low watermark, or the KafkaError the broker answered."""
    client = admin(bootstrap)
    futures = client.delete_records(wanted, request_timeout=30, operation_timeout=30)
    out: dict[int, object] = {}
    for tp, future in futures.items():
        try:
            out[tp.partition] = future.result(timeout=40).low_watermark
        except KafkaException as exc:
            out[tp.partition] = exc.args[0].code()
    return out


def test_delete_records_moves_the_log_start_on_every_replica_and_survives_kill_9(cluster: ClusterProcesses) -> None:
    client = admin(cluster.bootstrap)
    from confluent_kafka.admin import NewTopic
    client.create_topics([NewTopic(TOPIC, 2, 3, config={"segment.bytes": str(SEGMENT_BYTES)})])[TOPIC].result(30)
    wait_until(lambda: topic_ready(cluster, TOPIC, 2, 3), 30, f"{TOPIC} ready", cluster)
    ck_produce(cluster.bootstrap, TOPIC, _records(), {"acks": "all", "linger.ms": 0}, flush_every=10)
    assert ck_watermarks(cluster.bootstrap, TOPIC, 2) == {0: (0, PER_PARTITION), 1: (0, PER_PARTITION)}

    before = {node: _segment_bases(cluster, node, 0) for node in cluster.brokers}
    assert all(len(bases) >= 5 for bases in before.values()), before

    # -- librdkafka: partition 0 up to 120, partition 1 up to the high watermark (-1)
    got = _delete_with_librdkafka(cluster.bootstrap, [TopicPartition(TOPIC, 0, 120), TopicPartition(TOPIC, 1, -1)])
    assert got == {0: 120, 1: PER_PARTITION}, got
    assert ck_watermarks(cluster.bootstrap, TOPIC, 2) == {0: (120, PER_PARTITION), 1: (PER_PARTITION, PER_PARTITION)}
    read = ck_consume(cluster.bootstrap, TOPIC, {0: PER_PARTITION - 120})
    assert [(g.offset, g.value[:7]) for g in read] == [(i, f"p0-{i:04d}".encode()) for i in range(120, PER_PARTITION)]

    # -- every replica dropped the segments wholly below the new start (the answer waited for
    #    the in-sync replicas), and kept the one holding it
    for node in cluster.brokers:
        bases0 = _segment_bases(cluster, node, 0)
        assert bases0 == [b for b in before[node] if b >= max(x for x in before[node] if x <= 120)], \
            (node, before[node], bases0)
        assert bases0[0] > 0, (node, bases0)
        bases1 = _segment_bases(cluster, node, 1)
        assert bases1[0] <= PER_PARTITION and len(bases1) == 1, (node, bases1)  # the active segment stays

    # -- a read below the log start: OFFSET_OUT_OF_RANGE (auto.offset.reset=error shows it)
    consumer = ck_consumer(cluster.bootstrap, {"auto.offset.reset": "error"})
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 50)])
        errors = []
        for _ in range(40):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error():
                errors.append(msg.error().code())
                break
        assert errors == [KafkaError._AUTO_OFFSET_RESET], errors
    finally:
        consumer.close()

    # -- error answers: past the high watermark
    got = _delete_with_librdkafka(cluster.bootstrap, [TopicPartition(TOPIC, 0, PER_PARTITION + 1)])
    assert got == {0: KafkaError.OFFSET_OUT_OF_RANGE}, got
    # moving back is a no-op that answers the current low watermark
    got = _delete_with_librdkafka(cluster.bootstrap, [TopicPartition(TOPIC, 0, 10)])
    assert got == {0: 120}, got

    # -- kafka-python's admin client: partition 0 on to 200
    from kafka.admin import KafkaAdminClient
    from kafka.errors import UnknownTopicOrPartitionError
    from kafka.structs import TopicPartition as KpTopicPartition
    kp = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
    try:
        answer = kp.delete_records({KpTopicPartition(TOPIC, 0): 200}, timeout_ms=30000)
        assert answer == {KpTopicPartition(TOPIC, 0): {"partition_index": 0, "low_watermark": 200, "error_code": 0}}
        # an unknown topic, sent to a broker directly (librdkafka stops it on the client side)
        with pytest.raises(UnknownTopicOrPartitionError):
            kp.delete_records({KpTopicPartition("no-such-topic", 0): 1}, timeout_ms=10000, partition_leader_id=1)
    finally:
        kp.close()

    # -- kill -9 of every broker, then start them all: the starts were checkpointed before
    #    the answers, so nothing below them comes back
    for b in cluster.brokers.values():
        b.kill9()
    cluster.start()
    wait_until(lambda: topic_ready(cluster, TOPIC, 2, 3), 60, f"{TOPIC} ready after kill -9", cluster)
    wait_until(lambda: ck_watermarks(cluster.bootstrap, TOPIC, 2) == {0: (200, PER_PARTITION),
                                                                      1: (PER_PARTITION, PER_PARTITION)},
               30, "log starts after the restart", cluster)

    # -- and on whichever replica leads next
    leader = partitions_of(metadata(cluster.bootstrap, TOPIC), TOPIC)[0].leader
    cluster[leader].kill9()
    others = [n for n in cluster.brokers if n != leader]
    wait_until(lambda: partitions_of(metadata(cluster.bootstrap_of(*others), TOPIC), TOPIC)[0].leader in others,
               30, "a new leader of partition 0", cluster)
    wait_until(lambda: ck_watermarks(cluster.bootstrap_of(*others), TOPIC, 1)[0] == (200, PER_PARTITION), 30,
               "the new leader's log start", cluster)
    read = ck_consume(cluster.bootstrap_of(*others), TOPIC, {0: PER_PARTITION - 200})
    assert [g.offset for g in read] == list(range(200, PER_PARTITION))
