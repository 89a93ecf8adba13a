"""KIP-890 server-side verification on a 3-broker cluster: a partition leader asks the
transaction coordinator (itself, or another broker with AddPartitionsToTxn v4 verify_only)
before a transaction's first batch lands on a partition, so a produce for a partition never
added to the transaction, or one arriving after the transaction was aborted (a request
delayed in the network), is refused with INVALID_TXN_STATE instead of opening a transaction
that hangs and holds the last stable offset back forever.

Driven with raw requests through the project's client connections (the misbehaving
producer here is the network, which no well-behaved client library lets a test be)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from cluster.client.config import admin_config
from cluster.client.metadata import ClientCluster
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import TRANSACTIONAL_MASK
from cluster.protocol.sentinels import CONSUMER_REPLICA_ID, LATEST_TIMESTAMP, READ_COMMITTED
from tests.batches import values_batch
from tests.fault.test_transactions_faults import create_topics
from tests.harness import ClusterProcesses

TOPIC, PARTITIONS, TXN_ID = "ctp-out", 3, "late-writer"


async def produce(cluster: ClientCluster, partition: int, pid: int, epoch: int, seq: int, value: bytes) -> int:
    conn = await cluster.connection(cluster.metadata.leader(TOPIC, partition))
    resp = await conn.request(ApiKey.PRODUCE, {
        "transactional_id": TXN_ID, "acks": -1, "timeout": 10_000, "topic_data": [{"name": TOPIC, "partition_data": [{
            "index": partition, "records": values_batch([value], producer_id=pid, producer_epoch=epoch,
                                                        base_sequence=seq, attributes=TRANSACTIONAL_MASK)}]}]})
    return int(resp.responses[0].partition_responses[0].error_code)


async def stable_and_high(cluster: ClientCluster, partition: int) -> tuple[int, int]:
    out = []
    for isolation in (READ_COMMITTED, 0):
        resp = await cluster.leader_request(TOPIC, partition, ApiKey.LIST_OFFSETS, {
            "replica_id": CONSUMER_REPLICA_ID, "isolation_level": isolation, "topics": [{"name": TOPIC, "partitions": [
                {"partition_index": partition, "timestamp": LATEST_TIMESTAMP, "current_leader_epoch": -1}]}]})
        out.append(int(resp.topics[0].partitions[0].offset))
    return out[0], out[1]


async def scenario(bootstrap: str) -> dict[str, Any]:
    cluster = ClientCluster(admin_config({"bootstrap.servers": bootstrap}))
    try:
        await cluster.refresh({TOPIC})
        with trio.fail_after(30):  # a new __transaction_state's leaders settle (NOT_COORDINATOR meanwhile)
            while True:
                coordinator = await cluster.coordinator(TXN_ID, key_type=1)
                txn = await cluster.connection(coordinator)
                init = await txn.request(ApiKey.INIT_PRODUCER_ID, {
                    "transactional_id": TXN_ID, "transaction_timeout": 60_000, "producer_id": -1, "producer_epoch": -1})
                if init.error_code not in (ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress,
                                           ErrorCode.coordinator_not_available, ErrorCode.concurrent_transactions):
                    break
                await trio.sleep(0.2)
        assert init.error_code == 0
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
        added = await txn.request(ApiKey.ADD_PARTITIONS_TO_TXN, {
            "v3_and_below_transactional_id": TXN_ID, "v3_and_below_producer_id": pid,
            "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [{"name": TOPIC, "partitions": [0]}]})
        assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
        out: dict[str, Any] = {"coordinator": coordinator,
                               "leaders": [cluster.metadata.leader(TOPIC, p) for p in range(PARTITIONS)]}
        out["added partition"] = await produce(cluster, 0, pid, epoch, 0, b"in-the-transaction")
        out["partition not added"] = [await produce(cluster, p, pid, epoch, 0, b"stray") for p in (1, 2)]
        ended = await txn.request(ApiKey.END_TXN, {"transactional_id": TXN_ID, "producer_id": pid,
                                                   "producer_epoch": epoch, "committed": False})
        assert ended.error_code == 0
        with trio.fail_after(20):  # the abort's marker reaches partition 0
            while (await stable_and_high(cluster, 0))[0] < 2:
                await trio.sleep(0.1)
        out["after the abort"] = await produce(cluster, 0, pid, epoch, 1, b"late")
        again = await txn.request(ApiKey.INIT_PRODUCER_ID, {
            "transactional_id": TXN_ID, "transaction_timeout": 60_000, "producer_id": -1, "producer_epoch": -1})
        assert again.error_code == 0 and (again.producer_id, again.producer_epoch) == (pid, epoch + 1)
        # Partition 1 has no state of this producer: only the coordinator knows it is fenced.
        out["fenced epoch"] = await produce(cluster, 1, pid, epoch, 0, b"zombie")
        out["offsets"] = [await stable_and_high(cluster, p) for p in range(PARTITIONS)]
        return out
    finally:
        await cluster.aclose()


@pytest.mark.timeout(180)
def test_produce_outside_the_transaction_is_refused_and_nothing_hangs(cluster_factory: Any) -> None:
    cluster: ClusterProcesses = cluster_factory(3)
    create_topics(cluster)
    got = trio.run(scenario, cluster.bootstrap)
    print(f"coordinator {got['coordinator']}, partition leaders {got['leaders']}: {got}")
    assert got["added partition"] == ErrorCode.none
    assert got["partition not added"] == [ErrorCode.invalid_txn_state] * 2
    assert got["after the abort"] == ErrorCode.invalid_txn_state
    # Kafka answers a produce the coordinator finds fenced with INVALID_PRODUCER_EPOCH (the Java
    # producer aborts and learns it is fenced from EndTxn); PRODUCER_FENCED would be fatal at once.
    assert got["fenced epoch"] == ErrorCode.invalid_producer_epoch
    # Partition 0: the aborted record and its marker; 1 and 2 empty. Nothing holds an LSO back.
    assert got["offsets"] == [(2, 2), (0, 0), (0, 0)]
    assert len({got["coordinator"], *got["leaders"]}) > 1, "every partition led by the coordinator"
