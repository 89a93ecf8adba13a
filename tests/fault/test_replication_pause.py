"""Paused followers (issue 5): SIGSTOP a follower past replica.lag.time.max.ms and the ISR
shrinks, writes go on while min.insync.replicas is met and fail with NOT_ENOUGH_REPLICAS
once it is not; resumed followers catch up and join the ISR again. 0 acknowledged records
lost, 0 duplicates, order kept, replicas byte-identical.

Set-up, and why:
- 3 brokers plus 3 dedicated controller nodes: pausing brokers never touches the metadata
  quorum, so ISR changes can always commit (with the brokers as voters, pausing two of
  three would leave no quorum: the ISR could not shrink and acks=all would time out).
- replica.lag.time.max.ms=3000, broker.session.timeout.ms=30000: a paused follower leaves
  the ISR because its leader sees it lag, not because the controller fences it for missed
  heartbeats (Kafka's defaults, 30 s and 9 s, fence a frozen broker first). Every pause
  here stays well below the session timeout, and the tests check that the paused brokers
  are still registered (listed in Metadata) while they are out of the ISR.
- Explicit replica assignments: the paused brokers lead nothing, so every partition keeps its
  leader and the shrink / expand path is the only thing that changes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import NewTopic

from tests.cluster_helpers import (
    NotYet,
    admin,
    fast_teardown,
    log_mark,
    log_since,
    metadata,
    partitions_of,
    wait_until,
)
from tests.fault_workload import (
    ProducerWorkload,
    check_outcome,
    read_all,
    verify_replicas,
)
from tests.harness import REPO, ClusterProcesses

TOPIC = "ledger"
PROBE = "probe"
PARTITIONS = 6
RF = 3
LAG_MS = 3000
CONFIG = {"min_insync_replicas": 2, "replica_lag_time_max_ms": LAG_MS, "broker_session_timeout_ms": 30_000}
# How long an ISR change may take once due: the lag, the leader's check every lag/2, the
# controller's commit, and a loaded 2-core machine.
SHRINK_S = LAG_MS / 1000 * 1.5 + 10


@pytest.fixture
def clusters(cluster_factory: Callable[..., ClusterProcesses]) -> Iterator[Callable[..., ClusterProcesses]]:
    yield from fast_teardown(cluster_factory)


def create_assigned(bootstrap: str, name: str, assignment: list[list[int]], config: dict[str, str] | None = None,
                    timeout_s: float = 30.0) -> None:
    client = admin(bootstrap)  # referenced until the answer: a collected client cancels it
    futures = client.create_topics([NewTopic(name, len(assignment), replica_assignment=assignment, config=config or {})],
                                   operation_timeout=timeout_s, request_timeout=timeout_s)
    futures[name].result(timeout=timeout_s)


def started(clusters: Callable[..., ClusterProcesses], assignment: list[list[int]]) -> ClusterProcesses:
    """The cluster with TOPIC (6 partitions) and PROBE (1 partition) placed by `assignment`
    (PROBE takes the first one), every partition led by its preferred replica, full ISRs."""
    cluster = clusters(3, controllers=3, **CONFIG)
    create_assigned(cluster.bootstrap, TOPIC, assignment)
    create_assigned(cluster.bootstrap, PROBE, assignment[:1])
    wait_isrs(cluster, cluster.bootstrap, assignment, set(), 30)
    return cluster


def isr_is(bootstrap: str, topic: str, want: dict[int, tuple[int, set[int]]]) -> bool:
    """Metadata shows partition i led by want[i][0] with exactly the ISR want[i][1]."""
    parts = partitions_of(metadata(bootstrap, topic), topic)
    got = {i: (p.leader, set(p.isr)) for i, p in parts.items()}
    if got != want:
        raise NotYet(got)
    return True


def wait_isrs(cluster: ClusterProcesses, bootstrap: str, assignment: list[list[int]], out: set[int],
              timeout_s: float) -> None:
    """Wait until TOPIC (placed by `assignment`) and PROBE (by its first entry) are led by
    their preferred replicas with every replica but those in `out` in the ISR."""
    for topic, placed in ((TOPIC, assignment), (PROBE, assignment[:1])):
        want = shrunk_to(placed, out)
        wait_until(lambda: isr_is(bootstrap, topic, want), timeout_s,  # noqa: B023 - called at once
                   f"{topic}: ISRs {want}", cluster)


def registered_brokers(bootstrap: str) -> set[int]:
    """Brokers the Metadata answer lists: the registered, unfenced ones."""
    return set(metadata(bootstrap).brokers)


def shrunk_to(assignment: list[list[int]], paused: set[int]) -> dict[int, tuple[int, set[int]]]:
    return {i: (r[0], set(r) - paused) for i, r in enumerate(assignment)}


ISR_CHANGE = re.compile(r"broker (\d+): ISR of (\S+)-(\d+) is now \[([\d, ]*)\] \((.*)\)$", re.M)


def isr_changes(cluster: ClusterProcesses, mark: dict[int, int], topic: str) -> dict[int, list[str]]:
    """Per partition of `topic`, the ISR changes its leaders logged since `mark`, in order:
    "[1, 2] shrink (lagging: [3])", "[1, 2, 3] expand with 3", ..."""
    out: dict[int, list[str]] = {}
    for n in cluster.brokers:
        for m in ISR_CHANGE.finditer(log_since(cluster, n, mark)):
            if int(m.group(1)) == n and m.group(2) == topic:
                out.setdefault(int(m.group(3)), []).append(f"[{m.group(4)}] {m.group(5)}")
    return out


def logged_isr_changes(cluster: ClusterProcesses, mark: dict[int, int], want: dict[int, list[str]]) -> None:
    """The leaders of TOPIC logged exactly these ISR changes since `mark` (a broker may
    answer Metadata with a change a moment before its leader logs it)."""
    def logged() -> bool:
        got = isr_changes(cluster, mark, TOPIC)
        if got != want:
            raise NotYet(got)
        return True
    wait_until(logged, 5, f"ISR changes logged: {want}", cluster)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_paused_follower_leaves_the_isr_and_returns(clusters: Callable[..., ClusterProcesses]) -> None:
    """SIGSTOP broker 3 (a follower of every partition; brokers 1 and 2 lead three each)
    past replica.lag.time.max.ms: every ISR shrinks to the two others by replica lag (broker
    3 stays registered: not fenced), acks=all writes go on meanwhile; SIGCONT: broker 3
    catches up and every ISR is whole again."""
    assignment = [[1, 2, 3], [2, 1, 3]] * 3
    cluster = started(clusters, assignment)
    paused = 3
    live = cluster.bootstrap_of(1, 2)
    workload = ProducerWorkload(cluster.bootstrap, TOPIC, PARTITIONS).start()
    workload.wait_acked(1000)

    mark = log_mark(cluster)
    paused_at = time.monotonic()
    cluster[paused].pause()
    try:
        wait_isrs(cluster, live, assignment, {paused}, SHRINK_S)
        shrunk_after = time.monotonic() - paused_at
        # Shrunk because the leaders saw it lag, not fenced by the controller.
        assert registered_brokers(live) == {1, 2, 3}
        expected = {i: [f"{[b for b in r if b != paused]} shrink (lagging: [{paused}])"]
                    for i, r in enumerate(assignment)}
        logged_isr_changes(cluster, mark, expected)
        # Writes go on with two in-sync replicas.
        acked = workload.acked_count
        workload.wait_acked(acked + 2000, timeout_s=20)
        assert cluster[paused].alive()
        assert time.monotonic() - paused_at < CONFIG["broker_session_timeout_ms"] / 1000, "paused too long"
    finally:
        cluster[paused].resume()
    resumed_at = time.monotonic()
    print(f"ISR shrank {shrunk_after:.1f}s after the pause; paused {resumed_at - paused_at:.1f}s", flush=True)

    wait_isrs(cluster, cluster.bootstrap, assignment, set(), 30)
    print(f"ISR whole {time.monotonic() - resumed_at:.1f}s after the resume", flush=True)
    # One shrink and one expand per partition: the healthy followers never left the ISR.
    logged_isr_changes(cluster, mark, {
        i: [*shrink, f"{[*[b for b in assignment[i] if b != paused], paused]} expand with {paused}"]
        for i, shrink in expected.items()})
    acked = workload.acked_count
    workload.wait_acked(acked + 1000)
    check_outcome(cluster, workload)


class Probe:
    """A plain (not idempotent) acks=all producer that never retries: each send comes back
    with the broker's own answer."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                                  "retries": 0, "linger.ms": 0, "request.timeout.ms": 30_000,
                                  "message.timeout.ms": 60_000, "log_level": 2})
        self.results: dict[int, KafkaError | int] = {}  # value -> error or offset

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        self.results[int(msg.value())] = err if err is not None else msg.offset()

    def send(self, value: int) -> None:
        self.producer.produce(PROBE, value=str(value).encode(), partition=0, on_delivery=self._delivered)
        self.producer.poll(0)

    def outcome(self, value: int, timeout_s: float = 45.0) -> KafkaError | int:
        deadline = time.monotonic() + timeout_s
        while value not in self.results:
            assert time.monotonic() < deadline, f"probe {value}: no answer within {timeout_s}s"
            self.producer.poll(0.05)
        return self.results[value]

    def error_of(self, value: int) -> str:
        got = self.outcome(value)
        return "ok" if isinstance(got, int) else got.name()


@pytest.mark.slow
@pytest.mark.timeout(180)
def described(cluster: ClusterProcesses, flag: str) -> set[int]:
    """Partitions of TOPIC that `dcmirror topics describe FLAG --json` selects."""
    proc = subprocess.run([sys.executable, "-m", "deploy.cli", "topics", "describe", TOPIC, flag, "--json",
                           "--bootstrap", cluster.bootstrap_of(1)], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert all(r["min_insync_replicas"] == 2 for r in rows)
    return {p["partition"] for r in rows for p in r["partitions"]}


def test_two_paused_followers_stop_acks_all_writes(clusters: Callable[..., ClusterProcesses]) -> None:
    """Broker 1 leads every partition; SIGSTOP follower 2: the ISRs shrink to [1, 3] and
    writes go on. SIGSTOP follower 3 too: the ISRs shrink to [1] (the controller nodes still
    have their quorum), below min.insync.replicas=2. A send waiting for the paused replicas
    when the ISR shrinks gets NOT_ENOUGH_REPLICAS_AFTER_APPEND (it is in the log), later sends
    NOT_ENOUGH_REPLICAS (not in the log), and the idempotent workload gets no acknowledgement
    (it retries). SIGCONT both: every ISR is whole again and the workload's retries succeed,
    each record once at the offset it was acknowledged with."""
    assignment = [[1, 2, 3], [1, 3, 2]] * 3
    cluster = started(clusters, assignment)
    leader = cluster.bootstrap_of(1)
    probe = Probe(leader)
    probe.send(0)
    assert probe.outcome(0) == 0
    workload = ProducerWorkload(cluster.bootstrap, TOPIC, PARTITIONS).start()
    workload.wait_acked(1000)

    mark = log_mark(cluster)
    paused_at = time.monotonic()
    cluster[2].pause()
    try:
        wait_isrs(cluster, leader, assignment, {2}, SHRINK_S)
        # Two in-sync replicas meet min.insync.replicas=2: writes go on.
        probe.send(1)
        assert probe.error_of(1) == "ok"
        # kafka-topics' --at-min-isr-partitions / --under-min-isr-partitions.
        assert described(cluster, "--at-min-isr") == set(range(PARTITIONS))
        assert described(cluster, "--under-min-isr") == set()
        acked = workload.acked_count
        workload.wait_acked(acked + 1000, timeout_s=20)

        cluster[3].pause()
        # Sent at once: it waits for broker 3, which will not fetch, until the ISR shrinks.
        probe.send(2)
        wait_isrs(cluster, leader, assignment, {2, 3}, SHRINK_S)
        assert registered_brokers(leader) == {1, 2, 3}, "a paused broker was fenced: the test paused too long"
        assert probe.error_of(2) == "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
        probe.send(3)
        assert probe.error_of(3) == "NOT_ENOUGH_REPLICAS"
        # The workload's sends all wait or fail and are retried: nothing is acknowledged.
        stalled = workload.acked_count
        time.sleep(2.0)
        probe.send(4)
        assert probe.error_of(4) == "NOT_ENOUGH_REPLICAS"
        assert described(cluster, "--under-min-isr") == set(range(PARTITIONS))
        assert workload.acked_count == stalled, "acks=all acknowledged with an ISR of 1 < min.insync.replicas"
        assert time.monotonic() - paused_at < CONFIG["broker_session_timeout_ms"] / 1000, "paused too long"
    finally:
        cluster[2].resume()
        cluster[3].resume()
    resumed_at = time.monotonic()
    print(f"paused {resumed_at - paused_at:.1f}s; {stalled} acknowledged, none after the ISRs fell to [1]", flush=True)

    wait_isrs(cluster, cluster.bootstrap, assignment, set(), 30)
    print(f"ISR whole {time.monotonic() - resumed_at:.1f}s after the resume", flush=True)
    # Per partition: 2 leaves, 3 leaves, both come back (in either order); nothing else.
    def as_expected() -> bool:
        changes = isr_changes(cluster, mark, TOPIC)
        for i, r in enumerate(assignment):
            shrinks = [f"{[b for b in r if b != 2]} shrink (lagging: [2])", "[1] shrink (lagging: [3])"]
            if not any(changes.get(i) == [*shrinks, f"[1, {a}] expand with {a}", f"[1, {a}, {b}] expand with {b}"]
                       for a, b in ((2, 3), (3, 2))):
                raise NotYet(changes)
        return True
    wait_until(as_expected, 5, "per partition: 2 leaves the ISR, then 3, then both return", cluster)

    # The probe partition holds what was appended: 0, 1 and 2 (appended, then the ISR shrank
    # under it), not 3 and 4 (refused before the append).
    probe.send(5)
    assert probe.outcome(5) == 3
    assert read_all(cluster.bootstrap, PROBE, 1) == {0: [(0, 0), (1, 1), (2, 2), (3, 5)]}
    workload.wait_acked(workload.acked_count + 1000)
    check_outcome(cluster, workload)
    verify_replicas(cluster, PROBE)
