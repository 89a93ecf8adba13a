"""Failover in a 3-node cluster started from a topology file: the active controller or a
partition leader killed with SIGKILL, a broker stopped with SIGTERM (controlled shutdown),
preferred leader election (by request and automatic) after a bounced broker rejoined the ISRs.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ElectionType,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from tests.cluster_helpers import (
    ACTIVE,
    SESSION_TIMEOUT_S,
    NotYet,
    PartitionView,
    activation_wall_time,
    activations,
    admin,
    agreed_controller,
    create_topic,
    fast_teardown,
    kafka_python_partitions,
    latest_epoch_of,
    log_mark,
    log_since,
    metadata,
    metadata_from,
    partitions_of,
    topic_ready,
    wait_until,
)
from tests.harness import REPO, ClusterProcesses

ALL = [1, 2, 3]
TOPIC = "orders"


@pytest.fixture
def clusters(cluster_factory: Callable[..., ClusterProcesses]) -> Iterator[Callable[..., ClusterProcesses]]:
    yield from fast_teardown(cluster_factory)


def started(clusters: Callable[..., ClusterProcesses], **config: object) -> tuple[ClusterProcesses, int]:
    """A 3-node cluster whose brokers all registered; returns it and the agreed controller."""
    cluster = clusters(3, **config)
    controller = wait_until(lambda: agreed_controller(cluster, ALL, set(ALL)), 30,
                            "all 3 brokers registered and agreeing on one controller", cluster)
    return cluster, controller


def with_topic(cluster: ClusterProcesses, partitions: int = 6, rf: int = 3) -> dict[int, PartitionView]:
    create_topic(cluster.bootstrap, TOPIC, partitions, rf)
    return wait_until(lambda: topic_ready(cluster, TOPIC, partitions, rf), 30,
                      f"{TOPIC} with {partitions} partitions, RF {rf}, full ISRs", cluster)


def busiest_follower(before: dict[int, PartitionView], controller: int) -> tuple[int, set[int]]:
    """A broker that is not the controller and leads the most partitions; which it leads."""
    led = {n: {i for i, p in before.items() if p.leader == n} for n in ALL if n != controller}
    victim = max(led, key=lambda n: (len(led[n]), -n))
    assert led[victim], f"no follower of the controller leads a partition: {before}"
    return victim, led[victim]


def expected_leader(replicas: tuple[int, ...], isr: tuple[int, ...]) -> int:
    """Kafka's rule: the first replica, in assignment order, that is in the ISR."""
    return next(r for r in replicas if r in isr)


def assert_one_controller_per_epoch(cluster: ClusterProcesses) -> None:
    by_epoch: dict[int, set[int]] = {}
    for node, epoch in activations(cluster):
        by_epoch.setdefault(epoch, set()).add(node)
    assert all(len(nodes) == 1 for nodes in by_epoch.values()), by_epoch


# --------------------------------------------------------------------------- controller


def test_kill9_controller_another_node_takes_over_and_old_node_rejoins(clusters) -> None:
    cluster, old = started(clusters)
    old_epoch = latest_epoch_of(cluster, old)
    assert old_epoch is not None
    survivors = [n for n in ALL if n != old]
    live = cluster.bootstrap_of(*survivors)

    mark = log_mark(cluster)
    killed_at = time.monotonic()
    cluster[old].kill9()

    new = wait_until(lambda: agreed_controller(cluster, survivors), 10,
                     f"the survivors {survivors} agreeing on a new controller", cluster)
    assert new in survivors
    taken = [(int(m.group(1)), int(m.group(2))) for m in ACTIVE.finditer(log_since(cluster, new, mark))]
    assert taken and all(epoch > old_epoch for _, epoch in taken), (old_epoch, taken)

    # The new controller serves CreateTopics at once (the dead node may still be unfenced:
    # RF 2 is possible either way).
    create_topic(live, "after-failover", 6, 2)

    # Within the session timeout (counted from the old node's last contact) it is fenced and
    # no partition is led by it or keeps it in its ISR.
    def fenced_and_led_by_live() -> dict[int, PartitionView]:
        md = metadata(live, "after-failover")
        if set(md.brokers) != set(survivors):
            raise NotYet(f"brokers {sorted(md.brokers)}")
        parts = partitions_of(md, "after-failover")
        if len(parts) != 6 or any(p.leader not in survivors or not set(p.isr) <= set(survivors)
                                  for p in parts.values()):
            raise NotYet(parts)
        return parts

    budget = killed_at + SESSION_TIMEOUT_S + 4.0 - time.monotonic()
    parts = wait_until(fenced_and_led_by_live, budget, f"node {old} fenced and every partition led by "
                       f"a live broker within session timeout + 4 s of the kill", cluster)
    for i, p in parts.items():
        assert len(p.replicas) == 2 and p.leader == expected_leader(p.replicas, p.isr), (i, p)

    # Two live brokers cannot hold three replicas.
    with pytest.raises(KafkaException) as excinfo:
        create_topic(live, "rf3-on-two-brokers", 1, 3)
    assert excinfo.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR, excinfo.value

    # The old node restarts and rejoins as a broker; the controller stays where it is.
    mark = log_mark(cluster)
    cluster[old].start()
    ready = wait_until(lambda: re.search(rf"broker {old} is ready \(broker epoch \d+, controller (\d+)\)",
                                         log_since(cluster, old, mark)),
                       30, f"node {old} logging that it is ready", cluster)
    assert int(ready.group(1)) == new, ready.group(0)
    assert wait_until(lambda: agreed_controller(cluster, ALL, set(ALL)), 15,
                      "all 3 nodes listing 3 brokers and agreeing on the controller", cluster) == new
    assert "is the active controller" not in log_since(cluster, old, mark)
    assert_one_controller_per_epoch(cluster)

    # With three live brokers again, RF 3 works and every partition has a full ISR.
    create_topic(cluster.bootstrap, "after-rejoin", 3, 3)
    wait_until(lambda: topic_ready(cluster, "after-rejoin", 3, 3), 15, "after-rejoin ready", cluster)


# --------------------------------------------------------------------------- partition leaders


def test_kill9_broker_each_partition_gets_new_leader_from_its_isr(clusters) -> None:
    cluster, controller = started(clusters)
    before = with_topic(cluster)
    victim, led = busiest_follower(before, controller)
    survivors = [n for n in ALL if n != victim]
    live = cluster.bootstrap_of(*survivors)
    epochs_before = {i: p["leader_epoch"] for i, p in kafka_python_partitions(live, TOPIC).items()}
    part = min(led)

    mark = log_mark(cluster)
    cluster[victim].kill9()

    def moved() -> dict[int, PartitionView]:
        md = metadata(live, TOPIC)
        if victim in md.brokers:
            raise NotYet(f"broker {victim} not fenced yet")
        parts = partitions_of(md, TOPIC)
        if any(p.leader == victim or victim in p.isr for p in parts.values()):
            raise NotYet(parts)
        return parts

    after = wait_until(moved, SESSION_TIMEOUT_S + 3.0, f"broker {victim} fenced, out of every ISR and "
                       "leading nothing within session timeout + 3 s", cluster)
    assert sorted(after) == sorted(before)
    for i, p in after.items():
        b = before[i]
        assert p.replicas == b.replicas, (i, b, p)
        assert sorted(p.isr) == sorted(r for r in b.isr if r != victim), (i, b, p)  # the ISR shrank
        if i in led:
            assert p.leader in b.isr and p.leader == expected_leader(b.replicas, p.isr), (i, b, p)
        else:
            assert p.leader == b.leader, (i, b, p)  # a follower's death moves no leadership

    # What librdkafka does not show: offline replicas and leader epochs (kafka-python).
    seen = kafka_python_partitions(live, TOPIC)
    for i, p in seen.items():
        assert p["offline_replicas"] == [victim], (i, p)
        if i in led:
            assert p["leader_epoch"] > epochs_before[i], (i, p, epochs_before[i])
            line = f"broker {p['leader_id']} leads {TOPIC}-{i} (leader epoch {p['leader_epoch']})"
            assert line in log_since(cluster, p["leader_id"], mark), line
        else:
            assert p["leader_epoch"] == epochs_before[i], (i, p, epochs_before[i])

    # The moved partition takes writes on its new leader and gives them back exactly (nothing
    # was written to it before, so its log starts at 0).
    sent = records(0, 100)
    assert produce(live, part, sent, acks="1") == list(range(100))
    assert read_back(live, part, len(sent)) == [(i, key, value) for i, (key, value) in enumerate(sent)]


def test_records_acked_by_all_survive_kill9_of_their_leader(clusters) -> None:
    cluster, controller = started(clusters)
    before = with_topic(cluster)
    victim, led = busiest_follower(before, controller)
    survivors = [n for n in ALL if n != victim]
    live = cluster.bootstrap_of(*survivors)
    part = min(led)

    acked = records(0, 100)
    assert produce(cluster.bootstrap, part, acked, acks="all") == list(range(100))
    cluster[victim].kill9()  # right after the acknowledgement
    wait_until(lambda: partitions_of(metadata(live, TOPIC), TOPIC)[part].leader in survivors,
               SESSION_TIMEOUT_S + 3.0, f"a new leader for {TOPIC}-{part}", cluster)

    more = records(100, 100)
    sent = acked + more
    wait_until(lambda: high_watermark(live, part) >= len(acked), 5,
               f"{TOPIC}-{part} on its new leader holding the {len(acked)} records acked with acks=all",
               cluster)
    got = read_back(live, part, len(acked))
    assert got == [(i, key, value) for i, (key, value) in enumerate(acked)], (
        f"{len(got)} of {len(acked)} records acknowledged with acks=all survived the leader")
    assert produce(live, part, more, acks="all") == list(range(100, 200))
    assert read_back(live, part, len(sent)) == [(i, key, value) for i, (key, value) in enumerate(sent)]


Record = tuple[bytes, bytes]


def records(first: int, n: int) -> list[Record]:
    return [(f"key-{i}".encode(), f"value-{i:03d}".encode()) for i in range(first, first + n)]


def produce(bootstrap: str, partition: int, batch: list[Record], acks: str) -> list[int]:
    """Produce to one partition; the offsets given back in send order (every record acked)."""
    offsets: dict[bytes, int] = {}
    errors: list[KafkaError] = []

    def report(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            assert msg.partition() == partition
            offsets[msg.key()] = msg.offset()

    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "enable.idempotence": False,
                         "linger.ms": 5, "message.timeout.ms": 20000, "log_level": 2})
    for key, value in batch:
        producer.produce(TOPIC, key=key, value=value, partition=partition, on_delivery=report)
    assert producer.flush(30) == 0
    assert errors == []
    return [offsets[key] for key, _ in batch]


def high_watermark(bootstrap: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "failover-watermarks", "log_level": 2})
    try:
        return consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), timeout=5, cached=False)[1]
    finally:
        consumer.close()


def read_back(bootstrap: str, partition: int, n: int) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) from the beginning until n records and the end of the partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "failover-readback",
                         "enable.auto.commit": False, "enable.partition.eof": True, "log_level": 2})
    consumer.assign([TopicPartition(TOPIC, partition, OFFSET_BEGINNING)])
    got: list[tuple[int, bytes, bytes]] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    if len(got) >= n:
                        break
                    continue
                raise KafkaException(msg.error())
            got.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return got


# --------------------------------------------------------------------------- controlled shutdown


@pytest.mark.parametrize("role", ["follower", "controller"])
def test_sigterm_moves_leadership_away_before_the_broker_exits(clusters, role: str) -> None:
    cluster, controller = started(clusters)
    before = with_topic(cluster)
    if role == "controller":
        victim = controller
        led = {i for i, p in before.items() if p.leader == victim}
        assert led, before
    else:
        victim, led = busiest_follower(before, controller)
    survivors = [n for n in ALL if n != victim]
    mark = log_mark(cluster)

    t0 = time.monotonic()
    assert cluster[victim].stop() == 0
    exited, exited_wall = time.monotonic(), time.time()
    said = log_since(cluster, victim, mark)
    assert f"broker {victim}: controlled shutdown complete" in said, said
    assert exited - t0 < 5.0, f"SIGTERM to exit took {exited - t0:.1f}s:\n{said}"

    def check(parts: dict[int, PartitionView]) -> None:
        for i, p in parts.items():
            b = before[i]
            assert p.leader in survivors, (i, b, p)  # never leaderless with RF 3
            assert victim not in p.isr and sorted(p.isr) == sorted(r for r in b.isr if r != victim), (i, b, p)
            if i in led:
                assert p.leader == expected_leader(b.replicas, p.isr), (i, b, p)
            else:
                assert p.leader == b.leader, (i, b, p)

    if role == "follower":
        # The controller answered "shut down" only once the moves were committed and applied
        # there: its Metadata shows them as soon as the broker has exited.
        check(partitions_of(metadata_from(cluster, controller, TOPIC), TOPIC))

    # Every survivor has the moves at once, give or take a quorum fetch or two: a client
    # that asks any of them is not sent to the broker that left.
    def moved_at(node: int) -> Callable[[], dict[int, PartitionView]]:
        def poll() -> dict[int, PartitionView]:
            parts = partitions_of(metadata_from(cluster, node, TOPIC), TOPIC)
            if any(p.leader == victim for p in parts.values()):
                raise NotYet(parts)
            return parts
        return poll

    for node in survivors:
        budget = exited + 0.5 - time.monotonic()
        check(wait_until(moved_at(node), budget, f"node {node} showing no partition led by broker "
                         f"{victim} within 0.5 s of its exit", cluster))

    if role == "controller":
        # It resigned the quorum on the way out: a successor is elected at once, well before
        # an election timeout (>= controller.quorum.election.timeout.ms) could have passed.
        new = wait_until(lambda: agreed_controller(cluster, survivors), 10,
                         f"the survivors {survivors} agreeing on a new controller", cluster)
        assert new in survivors
        # Proven by why the successor stood, not by a stopwatch (on a loaded machine the
        # election after a resignation has taken 1.2 s, longer than one election timeout): it
        # began its pre-vote because the leader resigned, and no survivor stood because it had
        # heard nothing for an election timeout.
        said_new = log_since(cluster, new, mark)
        elected = activation_wall_time(said_new, new)
        assert elected is not None, said_new
        print(f"node {new} took over {elected - exited_wall:.3f}s after node {victim} exited")
        assert f"quorum node {new}: prospective" in said_new and f": leader {victim} resigned" in said_new, said_new
        for node in survivors:
            assert "no leader heard for an election timeout" not in log_since(cluster, node, mark), node

    # It stopped heartbeating: its session expires and it leaves the broker list.
    wait_until(lambda: set(metadata(cluster.bootstrap_of(*survivors)).brokers) == set(survivors),
               SESSION_TIMEOUT_S + 4.0, f"broker {victim} fenced after its session expired", cluster)


# --------------------------------------------------------------------------- preferred leaders


def test_preferred_election_on_a_balanced_topic_is_not_needed(clusters) -> None:
    cluster, _ = started(clusters)
    before = with_topic(cluster)
    assert all(p.leader == p.replicas[0] for p in before.values()), before
    client = admin(cluster.bootstrap)
    # (confluent-kafka 2.16's elect_leaders() raises SystemError for any timeout keyword: the
    # defaults are used and the future is waited on with a timeout instead.)
    tps = [TopicPartition(TOPIC, i) for i in sorted(before)]
    result = client.elect_leaders(ElectionType.PREFERRED, tps).result(timeout=30)
    assert sorted((tp.topic, tp.partition) for tp in result) == [(TOPIC, i) for i in sorted(before)]
    for tp, err in result.items():
        assert code_of(err) == KafkaError.ELECTION_NOT_NEEDED, (tp, err)

    # All partitions (null list): as Kafka, partitions that need no election are left out.
    assert client.elect_leaders(ElectionType.PREFERRED, None).result(timeout=30) == {}

    # A partition that does not exist is named in the answer.
    missing = TopicPartition(TOPIC, 99)
    result = client.elect_leaders(ElectionType.PREFERRED, [missing]).result(timeout=30)
    assert list(result) == [missing]
    assert code_of(result[missing]) == KafkaError.UNKNOWN_TOPIC_OR_PART, result

    assert topic_ready(cluster, TOPIC, 6, 3) == before  # nothing moved

    # The same through the CLI (kafka-leader-election.sh's options and answers).
    cli = [sys.executable, "-m", "deploy.cli", "elect-leaders"]
    if subprocess.run([*cli, "--help"], cwd=REPO, capture_output=True).returncode != 0:
        pytest.skip("no `dcmirror elect-leaders` yet")
    out = subprocess.run([*cli, "--bootstrap", cluster.bootstrap, "--election-type", "preferred",
                          "--topic", TOPIC], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(out.stdout.splitlines()) == sorted(
        f"Valid replica already elected for partitions {TOPIC}-{i}" for i in before), out.stdout
    out = subprocess.run([*cli, "--bootstrap", cluster.bootstrap, "--all-topic-partitions"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "No partition needed an election.\n"), out.stdout + out.stderr
    assert topic_ready(cluster, TOPIC, 6, 3) == before


def code_of(err: KafkaError | KafkaException | None) -> int | None:
    """elect_leaders() results hold a KafkaError per partition (its docstring says
    KafkaException)."""
    if isinstance(err, KafkaException):
        err = err.args[0]
    return None if err is None else err.code()


def bounce_and_wait_for_isr(cluster: ClusterProcesses, victim: int, before: dict[int, PartitionView]) -> None:
    survivors = [n for n in ALL if n != victim]
    cluster[victim].kill9()
    wait_until(lambda: all(p.leader != victim for p in
                           partitions_of(metadata(cluster.bootstrap_of(*survivors), TOPIC), TOPIC).values()),
               SESSION_TIMEOUT_S + 3.0, f"leadership moved off broker {victim}", cluster)
    cluster[victim].start()
    wait_until(lambda: all(set(p.isr) == set(p.replicas) for p in
                           partitions_of(metadata(cluster.bootstrap, TOPIC), TOPIC).values()),
               30, f"broker {victim} back in every ISR", cluster)


def test_manual_preferred_election_restores_leader_balance_after_a_bounce(clusters) -> None:
    cluster, controller = started(clusters, auto_leader_rebalance_enable=False)
    before = with_topic(cluster)
    victim, led = busiest_follower(before, controller)
    bounce_and_wait_for_isr(cluster, victim, before)
    unbalanced = partitions_of(metadata(cluster.bootstrap, TOPIC), TOPIC)
    assert all(unbalanced[i].leader != victim for i in led), unbalanced  # no automatic rebalance

    tps = [TopicPartition(TOPIC, i) for i in sorted(before)]
    client = admin(cluster.bootstrap)
    result = client.elect_leaders(ElectionType.PREFERRED, tps).result(timeout=30)
    assert len(result) == len(before)
    for tp, err in result.items():
        if tp.partition in led:
            assert err is None, (tp, err)
        else:
            assert code_of(err) == KafkaError.ELECTION_NOT_NEEDED, (tp, err)
    def preferred_leaders() -> dict[int, PartitionView]:
        # ElectLeaders answers once the controller committed the change; the broker asked
        # for metadata applies it from the metadata log a moment later.
        parts = topic_ready(cluster, TOPIC, 6, 3)
        if not all(p.leader == p.replicas[0] for p in parts.values()):
            raise NotYet(f"leaders not yet preferred: {parts}")
        return parts

    after = wait_until(preferred_leaders, 10, "every partition led by its preferred replica", cluster)
    assert {i for i, p in after.items() if p.leader == victim} == led


def test_automatic_rebalance_restores_leader_balance_after_a_bounce(clusters) -> None:
    cluster, controller = started(clusters, leader_imbalance_check_interval_seconds=2)
    before = with_topic(cluster)
    victim, led = busiest_follower(before, controller)
    bounce_and_wait_for_isr(cluster, victim, before)

    def balanced() -> dict[int, PartitionView]:
        parts = topic_ready(cluster, TOPIC, 6, 3)
        if any(p.leader != p.replicas[0] for p in parts.values()):
            raise NotYet(parts)
        return parts

    after = wait_until(balanced, 2 + 2 + 3, "every partition led by its preferred replica again "
                       "(check interval 2 s) without an ElectLeaders request", cluster)
    assert {i for i, p in after.items() if p.leader == victim} == led
