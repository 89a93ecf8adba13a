"""An acknowledged offset commit survives its coordinator's death.

Kafka's group coordinator answers an OffsetCommit (and a KIP-848 heartbeat that changed the
group) only once the record is on every in-sync replica of the group's `__consumer_offsets`
partition, within offsets.commit.timeout.ms; otherwise the commit is refused
(COORDINATOR_NOT_AVAILABLE) and the client commits again. A coordinator that answered at its
own append could acknowledge a commit, die, and leave a successor without it: the group
would re-read what it had committed.

The test makes that window as wide as it can be: both followers of the offsets partition are
frozen (SIGSTOP; still in the ISR, replica.lag.time.max.ms is long) while a commit is sent
to the leader, then the leader is killed -9 and the followers resumed. Whatever the leader
answered must be true afterwards: an acknowledged commit is what the new coordinator returns.
Dedicated controllers keep the metadata quorum out of it.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import NewTopic

from tests.cluster_helpers import NotYet, admin, fast_teardown, metadata, partitions_of, wait_until
from tests.harness import ClusterProcesses
from tests.interop.test_groups import RawClient

OFFSETS_TOPIC = "__consumer_offsets"
TOPIC, GROUP = "ledger", "durable-commits"
COMMIT_TIMEOUT_MS = 2000
CONFIG = {"offsets_topic_num_partitions": 1, "offsets_commit_timeout_ms": COMMIT_TIMEOUT_MS,
          "replica_lag_time_max_ms": 60_000, "broker_session_timeout_ms": 6000}
COORDINATOR_NOT_AVAILABLE = 15
OFFSET_INVALID = -1001  # no committed offset


@pytest.fixture
def clusters(cluster_factory: Callable[..., ClusterProcesses]) -> Iterator[Callable[..., ClusterProcesses]]:
    yield from fast_teardown(cluster_factory)


def raw_commit(bootstrap: str, offset: int) -> int:
    """OffsetCommit v2 of (TOPIC, 0) as a simple consumer (generation -1); its error code."""
    from kio.schema.offset_commit.v2 import request as creq
    from kio.schema.offset_commit.v2 import response as cresp

    raw = RawClient(bootstrap, client_id="committer")
    try:
        resp = raw.call(creq.OffsetCommitRequest(
            group_id=GROUP, generation_id_or_member_epoch=-1, member_id="", retention_time=datetime.timedelta(milliseconds=-1),  # type: ignore[arg-type]
            topics=(creq.OffsetCommitRequestTopic(name=TOPIC, partitions=(  # type: ignore[arg-type]
                creq.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset,  # type: ignore[arg-type]
                                                  committed_metadata=""),)),)), cresp.OffsetCommitResponse)
    finally:
        raw.close()
    return int(resp.topics[0].partitions[0].error_code)


def committed(bootstrap: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        (tp,) = consumer.committed([TopicPartition(TOPIC, 0)], timeout=10)
    finally:
        consumer.close()
    if tp.error is not None:
        raise NotYet(f"committed offsets: {tp.error}")
    return int(tp.offset)


def test_acknowledged_commit_survives_coordinator_kill9_with_frozen_followers(
        clusters: Callable[..., ClusterProcesses]) -> None:
    cluster = clusters(3, controllers=3, **CONFIG)
    client = admin(cluster.bootstrap)
    client.create_topics([NewTopic(TOPIC, 1, 3)], operation_timeout=30)[TOPIC].result(timeout=30)
    # Asking for the group's offsets creates __consumer_offsets; wait until its ISR is whole.
    wait_until(lambda: committed(cluster.bootstrap) == OFFSET_INVALID, 60, "a coordinator for the group")

    def whole() -> tuple[int, tuple[int, ...]]:
        view = partitions_of(metadata(cluster.bootstrap, OFFSETS_TOPIC), OFFSETS_TOPIC)[0]
        if len(view.isr) != 3:
            raise NotYet(f"offsets ISR {view.isr}")
        return view.leader, view.isr

    leader, isr = wait_until(whole, 60, "a whole offsets ISR")
    wait_until(lambda: raw_commit(cluster[leader].bootstrap, 5) == 0, 30, "commit 5")
    assert committed(cluster.bootstrap) == 5

    followers = [n for n in isr if n != leader]
    for n in followers:
        cluster[n].pause()
    try:
        started = time.monotonic()
        code = raw_commit(cluster[leader].bootstrap, 10)
        answered_s = time.monotonic() - started
        print(f"commit 10 with followers {followers} frozen: error {code} after {answered_s:.2f}s")
        cluster[leader].kill9()
    finally:
        for n in followers:
            cluster[n].resume()

    def survivors_offset() -> int:
        offset = committed(cluster.bootstrap_of(*followers))
        if offset < 0:
            raise NotYet(f"no committed offset ({offset})")
        return offset

    after = wait_until(survivors_offset, 90, "the new coordinator's offsets")
    print(f"after the kill the group's offset is {after}")
    # What the client was told holds: an acknowledged commit is there.
    assert code != 0 or after == 10, f"commit 10 was acknowledged, the new coordinator has {after}"
    assert after in (5, 10)
    # And the coordinator behaved as Kafka's: it waited for the frozen ISR, then refused.
    assert code == COORDINATOR_NOT_AVAILABLE and answered_s >= COMMIT_TIMEOUT_MS / 1000 * 0.9, (code, answered_s)
