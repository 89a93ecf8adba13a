"""KIP-101's two data-loss scenarios as regression tests on real broker processes.

A follower truncates only where its history and its leader's diverge, found with
OffsetForLeaderEpoch (KIP-101/279), never at its high watermark. The high watermark a
replica knows is stale by design (a follower learns it on its next fetch; the checkpoint
file is written every replica.high.watermark.checkpoint.interval.ms), so truncating to it
loses acknowledged records (scenario 1) or keeps a divergent tail (scenario 2).

Set-up common to both: 3 brokers plus 3 dedicated controller nodes (killing two brokers must
not take the metadata quorum with them), one partition with replicas [1, 2] (broker 1 the
preferred leader, broker 3 unused), min.insync.replicas=1 so the survivor of a crash can
take writes alone, values written by an idempotent acks=all producer, one value per record,
each phase flushed before the next.

On this KRaft-like architecture a broker that restarts registers a new incarnation and
leaves every ISR (its old incarnation is fenced, as in Kafka with KIP-903), and rejoins only
by fetching up to its leader's log end. So a replica that lacks records, or that did not
fetch since its restart, can only become leader by an unclean election: scenario 1 and the
first construction of scenario 2 use `dcmirror elect-leaders --election-type unclean` where
ZooKeeper-era Kafka got there through a stale ISR. The election happens when the test says
so (the topic keeps unclean.leader.election.enable=false), which keeps each step
deterministic. The second construction of scenario 2 simulates the power loss itself (it
cuts the unflushed tail off a stopped broker's segment) and needs no unclean election.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator

import pytest
from confluent_kafka.admin import NewTopic

from cluster.storage.log_manager import (
    RECOVERY_POINT_FILE,
    REPLICATION_OFFSET_FILE,
    read_offset_checkpoint,
)
from tests.cluster_helpers import (
    NotYet,
    PartitionView,
    admin,
    fast_teardown,
    log_mark,
    log_since,
    metadata_from,
    partitions_of,
    produce_acked,
    wait_until,
)
from tests.fault_workload import read_all, verify_replicas
from tests.harness import REPO, BrokerProcess, ClusterProcesses

TOPIC = "kip101"
TOPIC_CONFIG = {"min.insync.replicas": "1"}
TRUNCATED = re.compile(r"broker (\d+) truncated (\S+) from (\d+) to (\d+) \(diverged from leader (\d+) at epoch (-?\d+)\)")


@pytest.fixture
def clusters(cluster_factory: Callable[..., ClusterProcesses]) -> Iterator[Callable[..., ClusterProcesses]]:
    yield from fast_teardown(cluster_factory)


def started(clusters: Callable[..., ClusterProcesses], **config: object) -> ClusterProcesses:
    cluster = clusters(3, controllers=3, **config)
    client = admin(cluster.bootstrap)
    futures = client.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[1, 2]], config=TOPIC_CONFIG)],
                                   operation_timeout=30, request_timeout=30)
    futures[TOPIC].result(timeout=30)
    wait_state(cluster, 1, leader=1, isr={1, 2})
    return cluster


def state(cluster: ClusterProcesses, node: int) -> PartitionView:
    """TOPIC-0 as node `node` itself answers Metadata."""
    return partitions_of(metadata_from(cluster, node, TOPIC), TOPIC)[0]


def wait_state(cluster: ClusterProcesses, node: int, leader: int, isr: set[int], timeout_s: float = 30) -> None:
    def reached() -> bool:
        view = state(cluster, node)
        if view.leader != leader or set(view.isr) != isr:
            raise NotYet(view)
        return True
    wait_until(reached, timeout_s, f"node {node} reports {TOPIC}-0 led by {leader} with ISR {sorted(isr)}", cluster)


def produce(bootstrap: str, values: Iterable[int]) -> list[int]:
    """Each value as one record of TOPIC-0 (idempotent, acks=all), all acknowledged: their offsets."""
    return produce_acked(bootstrap, TOPIC, values)


def checkpointed_hw(broker: BrokerProcess) -> int | None:
    """TOPIC-0's high watermark in the broker's replication-offset-checkpoint file."""
    return read_offset_checkpoint(broker.data_dir / REPLICATION_OFFSET_FILE, "").get(f"{TOPIC}-0")


def lose_unflushed_tail(broker: BrokerProcess, from_offset: int, torn_bytes: int) -> int:
    """What a power loss does to a stopped broker's TOPIC-0 whose writes from `from_offset` on
    were never fsynced: they are gone but for `torn_bytes` of the first one (a torn write).
    Returns the bytes removed."""
    assert not broker.alive()
    recovery_point = read_offset_checkpoint(broker.data_dir / RECOVERY_POINT_FILE, "").get(f"{TOPIC}-0", 0)
    assert recovery_point <= from_offset, f"offsets below {recovery_point} are fsynced: a power loss keeps them"
    segments = sorted((broker.data_dir / f"{TOPIC}-0").glob("*.log"))
    assert len(segments) == 1, segments
    data = segments[0].read_bytes()
    pos = 0
    while pos < len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        if base_offset >= from_offset:
            break
        pos += 12 + length
    assert base_offset == from_offset, f"no batch starts at {from_offset}"
    os.truncate(segments[0], pos + torn_bytes)
    return len(data) - pos - torn_bytes


def elect_unclean(cluster: ClusterProcesses, via: int) -> None:
    proc = subprocess.run([sys.executable, "-m", "deploy.cli", "elect-leaders", "--election-type", "unclean",
                           "--topic", TOPIC, "--partition", "0", "--bootstrap", cluster.bootstrap_of(via)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and f"for partitions {TOPIC}-0" in proc.stdout, proc.stdout + proc.stderr


def truncations(cluster: ClusterProcesses, node: int, mark: dict[int, int]) -> list[tuple[int, int, int, int]]:
    """(from, to, leader, epoch) of every truncation of TOPIC-0 node `node` logged since `mark`."""
    return [(int(m.group(3)), int(m.group(4)), int(m.group(5)), int(m.group(6)))
            for m in TRUNCATED.finditer(log_since(cluster, node, mark))
            if int(m.group(1)) == node and m.group(2) == f"{TOPIC}-0"]


def records(cluster: ClusterProcesses) -> list[tuple[int, int]]:
    """(offset, value) of every committed record of TOPIC-0, read from the live brokers."""
    return read_all(cluster.bootstrap_of(*cluster.alive()), TOPIC, 1)[0]


SESSION_MS = 10_000


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_follower_with_stale_high_watermark_restarts_and_becomes_leader(
        clusters: Callable[..., ClusterProcesses]) -> None:
    """KIP-101 scenario 1: follower 2 has every acknowledged record but a checkpointed high
    watermark below its log end; it restarts, the leader dies, it leads: nothing is lost.

    1. 200 records; a clean restart of follower 2 checkpoints its high watermark (200 once
       its next fetch told it). The periodic checkpoint is switched off (1 h), so the file
       keeps saying that.
    2. 300 more acknowledged with the ISR [1, 2]: broker 2's log ends at 500, its HW file
       says 200. kill -9 broker 2, then the leader, broker 1.
    3. Broker 2 restarts while broker 1 is still the registered leader (the session timeout is
       10 s): a follower with a stale high watermark and a leader it cannot reach. Pre-KIP-101
       Kafka truncated to the high watermark here, dropping offsets 200..499.
    4. Broker 1's session expires: no leader (ISR [], ELR [1]). Unclean election: broker 2 leads, and
       serves offsets 0..499 exactly; 100 more go to it.
    5. Broker 1 returns as follower: its log (0..499, epoch 0) is a prefix of the leader's,
       no truncation; the replicas end byte-identical (dcmirror verify-replicas).
    """
    cluster = started(clusters, broker_session_timeout_ms=SESSION_MS,
                      replica_high_watermark_checkpoint_interval_ms=3_600_000)
    assert produce(cluster.bootstrap, range(200)) == list(range(200))
    time.sleep(1.5)  # broker 2 learns the high watermark 200 on its next fetch (≤ 500 ms)
    cluster[2].stop()
    stale_hw = checkpointed_hw(cluster[2])
    assert stale_hw is not None and stale_hw <= 200, stale_hw
    cluster[2].start()
    wait_state(cluster, 1, leader=1, isr={1, 2})

    assert produce(cluster.bootstrap, range(200, 500)) == list(range(200, 500))
    assert set(state(cluster, 1).isr) == {1, 2}  # so broker 2 had all 500 when they were acknowledged
    cluster[2].kill9()
    cluster[1].kill9()
    killed_at = time.monotonic()
    assert checkpointed_hw(cluster[2]) == stale_hw < 500  # broker 2's log ends at 500

    mark = log_mark(cluster)
    cluster[2].start()
    restarted_in = time.monotonic() - killed_at
    view = state(cluster, 2)
    assert view.leader == 1 and view.isr == (1,), (
        f"broker 2 was to restart as a follower of broker 1 before its session expired; {view} "
        f"after {restarted_in:.1f}s")
    # ELR (KIP-966) on: broker 1, the last ISR member, left the ISR for the ELR when fenced.
    wait_state(cluster, 2, leader=-1, isr=set(), timeout_s=SESSION_MS / 1000 + 10)
    assert truncations(cluster, 2, mark) == []

    elect_unclean(cluster, via=2)
    wait_state(cluster, 2, leader=2, isr={2})
    assert records(cluster) == [(i, i) for i in range(500)], "acknowledged records lost"
    assert produce(cluster.bootstrap_of(2), range(500, 600)) == list(range(500, 600))

    cluster[1].start()
    wait_state(cluster, 2, leader=2, isr={1, 2})
    assert truncations(cluster, 1, mark) == [] and truncations(cluster, 2, mark) == []
    assert records(cluster) == [(i, i) for i in range(600)]
    report = verify_replicas(cluster, TOPIC)
    assert sorted((r["broker_id"], r["log_end_offset"]) for r in report[0]["replicas"]) == [(1, 600), (2, 600)], report
    print(f"broker 2 restarted in {restarted_in:.1f}s with HW checkpoint {stale_hw}, log end 500", flush=True)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_divergent_tail_after_unclean_election_is_truncated_by_leader_epoch(clusters: Callable[..., ClusterProcesses]) -> None:
    """KIP-101 scenario 2 (and KIP-279): two replicas crash with different tails; the one that
    comes back first leads and writes on; the other must cut its own tail at the point of
    divergence, which only the leader epochs tell, and end byte-identical to the leader.

    A kill -9 loses nothing a process wrote (the page cache survives it), so the diverging
    tail is made the other way round: A (broker 1, leader) writes records B (broker 2) never
    gets because B is down, then A crashes and B comes back first.

    1. 200 records 0..199 on both (ISR [1, 2]).
    2. kill -9 B; after its session the ISR is [1]. A acknowledges 10000..10049 at offsets
       200..249 (min.insync.replicas=1) and checkpoints its high watermark 250.
    3. kill -9 A; B starts; no leader (ELR [1]) until an unclean election makes B leader in a
       new epoch starting at offset 200 (A's 50 records are lost: Kafka's unclean trade).
       B acknowledges 20000..20079 at offsets 200..279.
    4. A starts as follower of B. Truncating to its high watermark (250) would keep its tail
       and fetch from 250: offsets 200..249 would hold different records on the two replicas
       (or A would never catch up). By leader epoch: B answers that A's epoch ends at 200; A truncates 250 -> 200, fetches
       20000..20079; consumers see 0..199 then 20000..20079; the replicas are identical.
    """
    cluster = started(clusters, replica_high_watermark_checkpoint_interval_ms=200)
    assert produce(cluster.bootstrap, range(200)) == list(range(200))

    cluster[2].kill9()
    wait_state(cluster, 1, leader=1, isr={1})
    assert produce(cluster.bootstrap_of(1), range(10_000, 10_050)) == list(range(200, 250))
    wait_until(lambda: checkpointed_hw(cluster[1]) == 250, 10, "broker 1 checkpoints its high watermark 250", cluster)
    cluster[1].kill9()

    cluster[2].start()
    wait_state(cluster, 2, leader=-1, isr=set())  # broker 1 is in the ELR (KIP-966), broker 2 is not
    elect_unclean(cluster, via=2)
    wait_state(cluster, 2, leader=2, isr={2})
    assert records(cluster) == [(i, i) for i in range(200)]
    assert produce(cluster.bootstrap_of(2), range(20_000, 20_080)) == list(range(200, 280))

    mark = log_mark(cluster)
    cluster[1].start()
    wait_state(cluster, 2, leader=2, isr={1, 2})
    assert truncations(cluster, 1, mark) == [(250, 200, 2, 0)]  # from, to, leader, epoch
    expected = [(i, i) for i in range(200)] + [(200 + j, 20_000 + j) for j in range(80)]
    assert records(cluster) == expected
    report = verify_replicas(cluster, TOPIC)
    assert sorted((r["broker_id"], r["log_end_offset"]) for r in report[0]["replicas"]) == [(1, 280), (2, 280)], report
    assert truncations(cluster, 2, mark) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_replicas_crash_with_different_unflushed_tails(clusters: Callable[..., ClusterProcesses]) -> None:
    """KIP-101 scenario 2 as the KIP tells it: both replicas crash in a power loss, the one
    that comes back first lost an unflushed tail the other kept, leads cleanly and writes on;
    the other's high watermark is above the point of divergence, so only the leader epochs
    find it.

    1. 200 records 0..199, then 50 records 200..249, all on both replicas (ISR [1, 2]);
       A (broker 1) checkpoints its high watermark 250.
    2. kill -9 A: B (broker 2) leads alone (ISR [2], leader epoch 1 from offset 250).
    3. kill -9 B, and take from B's segment file what a power loss takes when nothing was
       fsynced since offset 200 (its recovery point is at most 200): the batches from offset
       200 on, but for a torn piece of the first. B's leader-epoch file still names epoch 1
       from offset 250; recovery must cut the log at 200 and that entry with it.
    4. B starts, is the whole ISR, leads (epoch 3 from offset 200) and acknowledges
       20000..20079 at offsets 200..279. (Records 200..249 were acknowledged and are gone:
       no fsync and every replica down at once is the one case acks=all does not cover.)
    5. A starts as follower with log end 250 and checkpointed high watermark 250: truncating
       to the high watermark would keep 200..249, where B holds other records. By leader
       epoch B answers that epoch 0 ends at 200: A truncates 250 -> 200 and fetches B's.
    """
    cluster = started(clusters, replica_high_watermark_checkpoint_interval_ms=200)
    assert produce(cluster.bootstrap, range(200)) == list(range(200))
    assert produce(cluster.bootstrap, range(200, 250)) == list(range(200, 250))
    wait_until(lambda: checkpointed_hw(cluster[1]) == 250, 10, "broker 1 checkpoints its high watermark 250", cluster)

    cluster[1].kill9()
    wait_state(cluster, 2, leader=2, isr={2})
    cluster[2].kill9()
    lost = lose_unflushed_tail(cluster[2], 200, torn_bytes=30)

    mark = log_mark(cluster)
    cluster[2].start()
    wait_state(cluster, 2, leader=2, isr={2})
    recovered = [line for line in log_since(cluster, 2, mark).splitlines() if f"recovered {TOPIC}-0 " in line]
    assert len(recovered) == 1 and recovered[0].endswith("log end offset 200"), recovered
    assert records(cluster) == [(i, i) for i in range(200)]
    assert produce(cluster.bootstrap_of(2), range(20_000, 20_080)) == list(range(200, 280))

    cluster[1].start()
    wait_state(cluster, 2, leader=2, isr={1, 2})
    assert truncations(cluster, 1, mark) == [(250, 200, 2, 0)]  # from, to, leader, epoch
    assert truncations(cluster, 2, mark) == []
    assert records(cluster) == [(i, i) for i in range(200)] + [(200 + j, 20_000 + j) for j in range(80)]
    report = verify_replicas(cluster, TOPIC)
    assert sorted((r["broker_id"], r["log_end_offset"]) for r in report[0]["replicas"]) == [(1, 280), (2, 280)], report
    print(f"broker 2 lost {lost} bytes of unflushed tail; {recovered[0]}", flush=True)
