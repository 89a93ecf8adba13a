"""Replication under faults (issue 5): 3 brokers, RF=3, min.insync.replicas=2, a librdkafka
idempotent acks=all producer writing unique sequential values to 6 partitions.

After every scenario: 0 acknowledged records lost, 0 duplicates, order kept per partition,
every record at the offset it was acknowledged with, and `dcmirror verify-replicas` finds the
replicas byte-identical up to the high watermark. Fault schedules print their seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from tests.cluster_helpers import (
    ACTIVE,
    PartitionView,
    create_topic,
    fast_teardown,
    metadata,
    partitions_of,
    topic_ready,
    wait_until,
)
from tests.fault_workload import (
    ProducerWorkload,
    check_outcome,
    fault_rng,
    wait_fully_replicated,
)
from tests.harness import ClusterProcesses

TOPIC = "ledger"
PARTITIONS = 6
RF = 3
CONFIG = {"min_insync_replicas": 2}


@pytest.fixture
def clusters(cluster_factory: Callable[..., ClusterProcesses]) -> Iterator[Callable[..., ClusterProcesses]]:
    yield from fast_teardown(cluster_factory)


def started(clusters: Callable[..., ClusterProcesses], controllers: int = 0, **config: object) -> ClusterProcesses:
    cluster = clusters(3, controllers=controllers, **{**CONFIG, **config})
    create_topic(cluster.bootstrap, TOPIC, PARTITIONS, RF)
    wait_until(lambda: topic_ready(cluster, TOPIC, PARTITIONS, RF), 30,
               f"{TOPIC}: {PARTITIONS} partitions, RF {RF}, full ISRs", cluster)
    return cluster


def leaders(cluster: ClusterProcesses) -> dict[int, PartitionView]:
    return partitions_of(metadata(cluster.bootstrap_of(*cluster.alive()), TOPIC), TOPIC)


def led_by(cluster: ClusterProcesses, node: int) -> set[int]:
    return {i for i, p in leaders(cluster).items() if p.leader == node}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hard_bounce_of_a_leader_five_times(clusters: Callable[..., ClusterProcesses]) -> None:
    """kill -9 a partition leader under load, restart it, five times."""
    rng = fault_rng("hard bounce")
    cluster = started(clusters)
    workload = ProducerWorkload(cluster.bootstrap, TOPIC, PARTITIONS).start()
    workload.wait_acked(1000)
    for bounce in range(5):
        victim_partition = rng.randrange(PARTITIONS)
        victim = leaders(cluster)[victim_partition].leader
        time.sleep(rng.uniform(0.2, 1.5))
        cluster[victim].kill9()
        print(f"bounce {bounce + 1}: killed broker {victim} (leader of {TOPIC}-{victim_partition})", flush=True)
        time.sleep(rng.uniform(0.5, 3.0))
        cluster[victim].restart()
        wait_fully_replicated(cluster, TOPIC, PARTITIONS, RF)
        workload.wait_acked(workload.acked_count + 500, cluster=cluster)
    check_outcome(cluster, workload)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_clean_bounce_of_a_leader_five_times(clusters: Callable[..., ClusterProcesses]) -> None:
    """SIGTERM a partition leader under load (controlled shutdown moves its leadership first),
    restart it, five times; prints the write unavailability of its partitions per bounce."""
    rng = fault_rng("clean bounce")
    cluster = started(clusters)
    workload = ProducerWorkload(cluster.bootstrap, TOPIC, PARTITIONS).start()
    workload.wait_acked(1000)
    windows: list[tuple[int, set[int], float, float]] = []
    for bounce in range(5):
        victim = leaders(cluster)[rng.randrange(PARTITIONS)].leader
        led = led_by(cluster, victim)
        time.sleep(rng.uniform(0.2, 1.5))
        stopped_at = time.monotonic()
        code = cluster[victim].stop()
        assert code == 0, f"broker {victim} exited {code} on SIGTERM"
        wait_until(lambda led=led, since=stopped_at: workload.acked_since(led, since), 30,
                   f"writes to {sorted(led)} acknowledged again after broker {victim} stopped", cluster)
        windows.append((victim, led, stopped_at, time.monotonic() + 0.5))
        print(f"bounce {bounce + 1}: stopped broker {victim} (leader of partitions {sorted(led)})", flush=True)
        time.sleep(rng.uniform(0.5, 2.0))
        cluster[victim].start()
        wait_fully_replicated(cluster, TOPIC, PARTITIONS, RF)
        workload.wait_acked(workload.acked_count + 500, cluster=cluster)
    result = workload.stop()
    gaps = [result.unavailability(led, start, end) for _, led, start, end in windows]
    for (victim, led, _, _), gap in zip(windows, gaps, strict=True):
        print(f"clean bounce of broker {victim}: writes to partitions {sorted(led)} unavailable for {gap * 1000:.0f} ms")
    print(f"write unavailability per clean bounce: max {max(gaps) * 1000:.0f} ms, "
          f"median {sorted(gaps)[len(gaps) // 2] * 1000:.0f} ms (target <= 1000 ms)")
    check_outcome(cluster, workload, RF, result)


def active_controller_from_logs(cluster: ClusterProcesses) -> int:
    """The node whose log has the latest "is the active controller (epoch N" line."""
    seen = [(int(m.group(2)), int(m.group(1)))
            for node in (*cluster.brokers.values(), *cluster.controllers.values())
            for m in ACTIVE.finditer(node.log_text())]
    assert seen, "no node logged becoming the active controller"
    return max(seen)[1]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("controllers", [0, 3], ids=["combined", "dedicated-controllers"])
def test_controller_and_a_leader_killed_together(clusters: Callable[..., ClusterProcesses], controllers: int) -> None:
    """kill -9 the active controller and a partition leader at the same moment, under load.

    combined: every broker is also a quorum voter; the victims are the active controller's
    node and the node leading the most other partitions, unless the controller's node leads
    partitions itself (then it is both, killed alone, and the quorum keeps its majority).
    dedicated-controllers: 3 brokers plus 3 controller-only nodes; the active controller node
    and a leading broker die, the other two controllers elect a new one, which fences the
    broker and elects new leaders.
    """
    rng = fault_rng(f"controller and leader killed ({'dedicated' if controllers else 'combined'})")
    cluster = started(clusters, controllers=controllers)
    workload = ProducerWorkload(cluster.bootstrap, TOPIC, PARTITIONS).start()
    workload.wait_acked(1000)
    for round_ in range(2):
        controller = active_controller_from_logs(cluster)
        if controller in cluster.brokers and led_by(cluster, controller):
            victims = [controller]
        else:
            candidates = sorted((n for n in cluster.brokers if n != controller), key=lambda n: (-len(led_by(cluster, n)), rng.random()))
            victims = [controller, candidates[0]]
        nodes = {**cluster.brokers, **cluster.controllers}
        time.sleep(rng.uniform(0.2, 1.5))
        killed_at = time.monotonic()
        for v in victims:
            nodes[v].proc.send_signal(9)  # type: ignore[union-attr]
        for v in victims:
            nodes[v].proc.wait(timeout=10)  # type: ignore[union-attr]
        print(f"round {round_ + 1}: killed {victims} (active controller {controller})", flush=True)
        survivors = set(cluster.brokers) - set(victims)
        if controllers or len(victims) == 1:
            # The quorum kept its majority: partitions move to the surviving brokers.
            wait_until(lambda since=killed_at: workload.acked_since(set(range(PARTITIONS)), since), 60,
                       f"writes to every partition acknowledged again with brokers {sorted(survivors)}", cluster)
            print(f"round {round_ + 1}: every partition writable again after "
                  f"{time.monotonic() - killed_at:.2f} s", flush=True)
        time.sleep(rng.uniform(0.5, 2.0))
        for v in victims:
            nodes[v].start(wait_ready=False)
        for v in victims:
            if v in cluster.brokers:
                nodes[v].wait_ready()
        wait_fully_replicated(cluster, TOPIC, PARTITIONS, RF)
        workload.wait_acked(workload.acked_count + 500, cluster=cluster)
    check_outcome(cluster, workload)
