"""KIP-392, fetch from follower, on a real 3-broker cluster whose brokers sit in three racks
(`racks = [...]` in the topology, which also turns on the rack-aware replica selector).

A consumer that says its rack (`client.rack`) is sent by the leader to the in-sync replica
of its rack and reads every record there: the bytes each broker sent to consumers, from
its /metrics, show who served it. Clients: librdkafka (confluent-kafka), the project's own
trio consumer (what mirror workers use) and the warehouse loader's range reader. A consumer
in the leader's rack, or without a rack, reads from the leader. When the follower it reads
from is killed, the consumer goes back to the leader and still reads each record once, in
order.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka.admin import NewTopic

from cluster.client.sync import SyncConsumer
from spark_aggregate.fetch import read_chunks
from spark_aggregate.ranges import OffsetRange
from tests.cluster_helpers import admin, topic_ready, wait_until
from tests.harness import ClusterProcesses
from tests.interop.clients import ck_consume, ck_produce
from tests.interop.common import Rec
from tests.ops.common import scrape, value

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

TOPIC = "nearby"
RACKS = ("rack-a", "rack-b", "rack-c")  # brokers 1, 2, 3
RECORDS = 2000
VALUE_BYTES = 500


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterProcesses]:
    c = ClusterProcesses(tmp_path_factory.mktemp("kip392"), 3, racks=RACKS, admin_http=True,
                         **{"broker.session.timeout.ms": 2000}).start()
    try:
        client = admin(c.bootstrap)
        # Leader 1 (rack-a), followers 2 (rack-b) and 3 (rack-c).
        client.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[1, 2, 3]])])[TOPIC].result(30)
        wait_until(lambda: topic_ready(c, TOPIC, 1, 3), 30, f"{TOPIC} ready", c)
        ck_produce(c.bootstrap, TOPIC, records(0, RECORDS), {"acks": "all"})
        yield c
    finally:
        c.stop()


def bytes_out(cluster: ClusterProcesses) -> dict[int, float]:
    """Record bytes each broker has sent to consumers of TOPIC (dcmirror_broker_bytes_out_total)."""
    return {n: value(scrape(cluster.admin_http_base(n)), "dcmirror_broker_bytes_out_total", topic=TOPIC)
            for n in cluster.brokers if cluster[n].alive()}


def served_by(cluster: ClusterProcesses, before: dict[int, float]) -> dict[int, float]:
    after = bytes_out(cluster)
    return {n: after[n] - before.get(n, 0.0) for n in after}


def expect_values(values: list[bytes]) -> None:
    assert len(values) == RECORDS, f"{len(values)} records, not {RECORDS}"
    assert [int(v[:6]) for v in values] == list(range(RECORDS)), "not each record once, in order"


def rack_consumer(cluster: ClusterProcesses, rack: str) -> SyncConsumer:
    consumer = SyncConsumer({"bootstrap.servers": cluster.bootstrap, "client.rack": rack,
                             "auto.offset.reset": "earliest"})
    consumer.assign([(TOPIC, 0)])
    return consumer


def read_until(cluster: ClusterProcesses, consumer: SyncConsumer, values: list[bytes], count: int, what: str) -> None:
    """Poll `consumer` into `values` until it holds `count` records (60 s at most)."""
    wait_until(lambda: values.extend(r.value or b"" for rs in consumer.poll(1.0).values() for r in rs)
               or len(values) >= count, 60, what, cluster)


def records(first: int, last: int) -> list[Rec]:
    return [Rec(0, b"%d" % i, b"%06d-" % i + b"v" * (VALUE_BYTES - 7), (), 0) for i in range(first, last)]


def log_bytes(cluster: ClusterProcesses) -> int:
    return sum(p.stat().st_size for p in (cluster[1].data_dir / f"{TOPIC}-0").glob("*.log"))


@pytest.mark.parametrize(("rack", "server"), [("rack-c", 3), ("rack-b", 2), ("rack-a", 1), ("", 1)])
def test_librdkafka_reads_from_the_replica_in_its_rack(cluster: ClusterProcesses, rack: str, server: int) -> None:
    before = bytes_out(cluster)
    conf = {"client.rack": rack} if rack else {}
    got = ck_consume(cluster.bootstrap, TOPIC, {0: RECORDS}, conf=conf, timeout_s=60)
    expect_values([g.value or b"" for g in got])
    served = served_by(cluster, before)
    total = log_bytes(cluster)
    print(f"client.rack={rack!r}: bytes sent per broker {served} (the log holds {total} bytes)")
    assert served[server] >= total, served
    assert all(v == 0 for n, v in served.items() if n != server), served


def test_the_projects_consumer_and_the_loader_read_from_their_racks_follower(cluster: ClusterProcesses) -> None:
    before = bytes_out(cluster)
    values: list[bytes] = []
    with rack_consumer(cluster, "rack-b") as consumer:
        read_until(cluster, consumer, values, RECORDS, "the trio consumer read every record")
    expect_values(values)
    served = served_by(cluster, before)
    print(f"trio consumer in rack-b: bytes sent per broker {served}")
    assert served[2] >= log_bytes(cluster) and served[1] == served[3] == 0, served

    before = bytes_out(cluster)
    chunks = list(read_chunks({"bootstrap.servers": cluster.bootstrap, "client.rack": "rack-c"},
                              OffsetRange(TOPIC, 0, 0, RECORDS)))
    assert chunks[0].fetch_offset == 0 and chunks[-1].next_offset == RECORDS
    served = served_by(cluster, before)
    print(f"warehouse range reader in rack-c: bytes sent per broker {served}")
    assert served[3] >= log_bytes(cluster) and served[1] == served[2] == 0, served


def test_a_consumer_whose_follower_dies_goes_back_to_the_leader_and_reads_each_record_once(
        cluster: ClusterProcesses) -> None:
    """Last in the module: it kills broker 3. The consumer reads from broker 3 (its rack's
    follower); broker 3 dies; RECORDS more are written, which only the leader (or broker 2,
    in another rack) can serve: the consumer reads them all from the leader, each once."""
    before = bytes_out(cluster)
    values: list[bytes] = []
    with rack_consumer(cluster, "rack-c") as consumer:
        read_until(cluster, consumer, values, RECORDS, "the consumer read the topic from broker 3")
        from_follower = served_by(cluster, before)
        assert from_follower[3] > 0 and from_follower[1] == from_follower[2] == 0, from_follower
        cluster[3].kill9()
        before = bytes_out(cluster)
        ck_produce(cluster.bootstrap_of(1, 2), TOPIC, records(RECORDS, 2 * RECORDS), {"acks": "1"})
        read_until(cluster, consumer, values, 2 * RECORDS, "the consumer read on from the leader")
    assert [int(v[:6]) for v in values] == list(range(2 * RECORDS)), "not each record once, in order"
    after = {n: v - before[n] for n, v in bytes_out(cluster).items()}
    print(f"rack-c consumer after broker 3 was killed and {RECORDS} more records written: bytes sent {after}")
    assert after[1] >= RECORDS * VALUE_BYTES and after[2] == 0, after
