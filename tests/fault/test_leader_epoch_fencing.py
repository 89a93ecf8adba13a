"""Fetch, ListOffsets and OffsetForLeaderEpoch carry the client's current leader epoch
(KIP-320): a broker answers FENCED_LEADER_EPOCH to an older one, UNKNOWN_LEADER_EPOCH to a
newer one, NOT_LEADER_OR_FOLLOWER on a follower; after a failover the old epoch is fenced on
the new leader. The replica verifier's id (-2) may read a follower; a consumer may read one
only with Fetch v11+ (KIP-392, as Kafka: a v10 consumer fetch there is NOT_LEADER_OR_FOLLOWER).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio
from confluent_kafka import Producer

from cluster.client.connection import BrokerConnection
from cluster.protocol.errors import ErrorCode
from tests.cluster_helpers import (
    NotYet,
    create_topic,
    fast_teardown,
    kafka_python_partitions,
    topic_ready,
    wait_until,
)
from tests.harness import ClusterProcesses

TOPIC = "epochs"


@pytest.fixture
def clusters(cluster_factory: Callable[..., ClusterProcesses]) -> Iterator[Callable[..., ClusterProcesses]]:
    yield from fast_teardown(cluster_factory)


def fetch_body(offset: int, epoch: int, replica_id: int = -1) -> dict[str, Any]:
    return {"replica_id": replica_id, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": TOPIC, "partitions": [{
                "partition": 0, "current_leader_epoch": epoch, "fetch_offset": offset, "last_fetched_epoch": -1,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}


def ask(cluster: ClusterProcesses, node: int, epoch: int, replica_id: int = -1,
        fetch_version: int | None = None) -> dict[str, int]:
    """Error codes from `node` for partition 0 when the client believes the leader epoch is `epoch`."""
    async def main() -> dict[str, int]:
        conn = await BrokerConnection("127.0.0.1", cluster[node].port).connect()
        try:
            fetch = (await conn.request(1, fetch_body(0, epoch, replica_id),
                                        version=fetch_version)).responses[0].partitions[0]
            lo = (await conn.request(2, {"replica_id": -1, "isolation_level": 0, "topics": [
                {"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1,
                                                "current_leader_epoch": epoch}]}]})).topics[0].partitions[0]
            ofle = (await conn.request(23, {"replica_id": -1, "topics": [
                {"topic": TOPIC, "partitions": [{"partition": 0, "current_leader_epoch": epoch,
                                                 "leader_epoch": max(epoch, 0)}]}]})).topics[0].partitions[0]
            return {"fetch": fetch.error_code, "list_offsets": lo.error_code, "offset_for_leader_epoch": ofle.error_code,
                    "fetched_bytes": len(fetch.records or b"")}
        finally:
            await conn.aclose()
    return trio.run(main)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stale_and_future_leader_epochs_are_fenced(clusters: Callable[..., ClusterProcesses]) -> None:
    cluster = clusters(3)
    create_topic(cluster.bootstrap, TOPIC, 1, 3)
    wait_until(lambda: topic_ready(cluster, TOPIC, 1, 3), 30, f"{TOPIC} with a full ISR", cluster)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(10):
        producer.produce(TOPIC, value=b"%d" % i, partition=0)
    assert producer.flush(30) == 0
    part = kafka_python_partitions(cluster.bootstrap, TOPIC)[0]
    leader, epoch = part["leader_id"], part["leader_epoch"]
    follower = next(r for r in part["replica_nodes"] if r != leader)

    ok = ErrorCode.none
    current = ask(cluster, leader, epoch)
    assert current["fetched_bytes"] > 0
    assert {k: v for k, v in current.items() if k != "fetched_bytes"} == dict.fromkeys(
        ("fetch", "list_offsets", "offset_for_leader_epoch"), ok)
    assert ask(cluster, leader, -1)["fetched_bytes"] > 0  # no epoch given: no check, as old clients
    stale = ask(cluster, leader, epoch - 1) if epoch > 0 else None
    if stale is not None:
        assert {k: v for k, v in stale.items() if k != "fetched_bytes"} == dict.fromkeys(
            ("fetch", "list_offsets", "offset_for_leader_epoch"), ErrorCode.fenced_leader_epoch)
    future = ask(cluster, leader, epoch + 1)
    assert {k: v for k, v in future.items() if k != "fetched_bytes"} == dict.fromkeys(
        ("fetch", "list_offsets", "offset_for_leader_epoch"), ErrorCode.unknown_leader_epoch)
    on_follower = ask(cluster, follower, epoch, fetch_version=10)
    assert on_follower["fetch"] == ErrorCode.not_leader_or_follower
    assert ask(cluster, follower, epoch)["fetch"] == ok  # v12: a follower serves consumers (KIP-392)
    assert ask(cluster, follower, epoch + 1)["fetch"] == ErrorCode.unknown_leader_epoch  # and checks epochs
    assert on_follower["list_offsets"] == ErrorCode.not_leader_or_follower
    assert on_follower["offset_for_leader_epoch"] == ErrorCode.not_leader_or_follower
    verifier = ask(cluster, follower, -1, replica_id=-2)  # kafka-replica-verification's id
    assert verifier["fetch"] == ok and verifier["fetched_bytes"] > 0

    # Failover: the old epoch is fenced on the new leader.
    cluster[leader].kill9()
    survivors = [n for n in (1, 2, 3) if n != leader]

    def new_leader() -> tuple[int, int] | None:
        try:
            p = kafka_python_partitions(cluster.bootstrap_of(*survivors), TOPIC)[0]
        except Exception as exc:  # kafka-python: the dead broker is still listed for a moment
            raise NotYet(repr(exc)) from exc
        return (p["leader_id"], p["leader_epoch"]) if p["leader_id"] in survivors else None
    now_leader, now_epoch = wait_until(new_leader, 30, "a new leader among the survivors", cluster)
    assert now_epoch > epoch
    after = ask(cluster, now_leader, epoch)
    assert {k: v for k, v in after.items() if k != "fetched_bytes"} == dict.fromkeys(
        ("fetch", "list_offsets", "offset_for_leader_epoch"), ErrorCode.fenced_leader_epoch)
    assert ask(cluster, now_leader, now_epoch)["fetch"] == ok
