"""dcmirror's key partitioner against librdkafka's murmur2_random (the Java client's default):
10,000 keys must land on the same partitions, so records keep their partition whichever
client produced them."""

from __future__ import annotations

import random

import pytest
from confluent_kafka import Producer

from cluster.client.partitioner import murmur2, partition_for_key
from tests.harness import BrokerProcess
from tests.interop.clients import ck_create_topic

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("key", "expected"), [
    # Kafka's UtilsTest.testMurmur2 vectors (signed 32-bit results).
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
])
def test_murmur2_matches_kafkas_reference_values(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_ten_thousand_keys_land_where_librdkafka_puts_them(broker: BrokerProcess) -> None:
    partitions = 12
    ck_create_topic(broker.bootstrap, "keyed", partitions)
    rng = random.Random(20261121)
    keys = [b"", *(rng.randbytes(rng.randrange(1, 40)) for _ in range(9_999))]
    placed: dict[bytes, int] = {}

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        placed[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    producer = Producer({"bootstrap.servers": broker.bootstrap, "partitioner": "murmur2_random",
                         "linger.ms": 20, "acks": 1})
    for key in keys:
        producer.produce("keyed", key=key, value=b"v", on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert len(placed) == len(set(keys))
    mismatched = {k: (p, partition_for_key(k, partitions)) for k, p in placed.items()
                  if p != partition_for_key(k, partitions)}
    assert not mismatched, f"{len(mismatched)} keys placed differently, e.g. {list(mismatched.items())[:5]}"
    assert len(set(placed.values())) == partitions  # the keys spread over every partition
