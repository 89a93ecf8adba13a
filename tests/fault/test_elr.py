"""KIP-966 eligible leader replicas on real broker processes (issue 32).

The window ELR closes: the last in-sync replica of a partition crashes and loses its
unsynced tail (a machine crash: the page cache is gone), while a replica that left the ISR
just before, cleanly, still holds every acknowledged record. Before KIP-966 the last ISR
member stays in the ISR and leads again when it is back, and the acknowledged records it
lost are gone for good (its followers truncate to its log). With ELR the replica that left
is an eligible leader replica, the crashed one registers without a clean-shutdown marker
(previous_broker_epoch -1) and leaves every ISR and ELR, and the partition waits for the
eligible one.

Set-up: 4 brokers and 3 dedicated controller nodes (so the metadata quorum survives what
the brokers go through, and the active controller can be killed). Topic `elr` has one
partition on brokers [1, 2, 3] (broker 1 the preferred leader), min.insync.replicas=2;
broker 4 hosts none of it and stays up, so there is always a broker to describe the
partition and to bootstrap from while brokers 1-3 are all down. Values are written by an
idempotent acks=all producer, one value per record: batch 1 is 0..99, batch 2 100..199.

1. Batch 1 with the ISR [1, 2, 3]. Broker 3 stops cleanly (controlled shutdown, clean
   marker with its broker epoch): ISR [1, 2], ELR [] (the ISR is at min ISR: 3 is not
   eligible, it will lack batch 2).
2. Batch 2, acknowledged with the ISR [1, 2]. Broker 2 stops cleanly: ISR [1], ELR [2]
   (with ELR off: ISR [1], nothing else). An acks=all produce is refused:
   NOT_ENOUGH_REPLICAS.
3. Broker 1 (the leader) is killed -9 and its unsynced tail is lost: its segment is cut
   where batch 2 starts (nothing after its recovery point was fsynced, so a machine crash
   may lose exactly that). ELR on: ISR [], ELR [2, 1], LastKnownElr [1]. ELR off: ISR [1].
4. The replicas come back in the worst order: 1, then 3, then 2.

With ELR (test_elr_keeps_acknowledged_records): 1 registers unclean and leaves the ELR
(leaderless, ISR [], ELR [2]); 3 is not eligible (still leaderless; Kafka's kafka-topics
--describe shows `Elr: 2` here); 2 is eligible and leads; 1 and 3 catch up from it. Every
acknowledged record of both batches is read back once, in order, at its acknowledged
offset; the replicas end byte-identical (dcmirror verify-replicas). Between steps 3 and 4
the active controller is killed -9 (scenario C): a new one takes over, the ELR is still
reported, and the changes of step 4 (1 out of the ELR, 2 elected from it) are the new
controller's.

Without ELR (test_without_elr_the_crashed_leader_leads_and_batch_2_is_lost, the feature
downgraded first with Apache Kafka's kafka-features, upgraded again at the end): 1 is
elected as soon as it is back, 2 truncates batch 2 away when it follows; the same checker
finds batch 2 lost, which is the window ELR closes.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import trio
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import NewTopic

from cluster.client.connection import BrokerConnection
from cluster.protocol.api_keys import ApiKey
from cluster.storage.log_manager import (
    CLEAN_SHUTDOWN_FILE,
    RECOVERY_POINT_FILE,
    read_offset_checkpoint,
)
from tests.cluster_helpers import (
    NotYet,
    admin,
    fast_teardown,
    log_mark,
    log_since,
    produce_acked,
    wait_until,
)
from tests.fault_workload import read_all, verify_replicas
from tests.harness import REPO, BrokerProcess, ClusterProcesses
from tests.peers.tool_runner import KafkaTools

# (the timeout covers waiting for the heavy-test lock behind another heavy test of the run)
pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(900)]

TOPIC = "elr"
REPLICAS = [1, 2, 3]
OBSERVER = 4  # hosts no replica of TOPIC: always up
BATCH_1 = list(range(100))
BATCH_2 = list(range(100, 200))
PROBE = 9_999  # the value of the acks=all write refused while the ISR is [1]
ELR_FEATURE = "eligible.leader.replicas.version"
WAIT_S = 30.0
ACTIVE = re.compile(r"node (\d+) is the active controller \(epoch (\d+)")
TRUNCATED = re.compile(r"broker (\d+) truncated (\S+) from (\d+) to (\d+)")
RECOVERED = re.compile(rf"recovered {TOPIC}-0 from recovery point \d+: .*; log end offset (\d+)")


@pytest.fixture
def clusters(cluster_factory: Callable[..., ClusterProcesses]) -> Iterator[Callable[..., ClusterProcesses]]:
    yield from fast_teardown(cluster_factory)


@pytest.fixture(scope="module")
def kafka_tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaTools]:
    """Apache Kafka's tools in one JVM (started on first use)."""
    with KafkaTools(tmp_path_factory.mktemp("elr-tools")) as tools:
        yield tools


# ---- what the brokers say ---------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """TOPIC-0 as one broker answers DescribeTopicPartitions."""

    node: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    elr: tuple[int, ...]
    last_known_elr: tuple[int, ...]

    def __str__(self) -> str:
        return (f"node {self.node}: leader {self.leader} (epoch {self.leader_epoch}) ISR {list(self.isr)} "
                f"ELR {list(self.elr)} LastKnownElr {list(self.last_known_elr)}")


def describe(cluster: ClusterProcesses, node: int) -> View:
    """TOPIC-0 as broker `node` itself answers (NotYet while it cannot)."""
    async def ask() -> Any:
        conn = await BrokerConnection("127.0.0.1", cluster[node].port).connect(timeout_s=3.0)
        try:
            return await conn.request(ApiKey.DESCRIBE_TOPIC_PARTITIONS, {
                "topics": [{"name": TOPIC}], "response_partition_limit": 10, "cursor": None}, timeout_s=5.0)
        finally:
            await conn.aclose()
    try:
        resp = trio.run(ask)
    except Exception as exc:  # noqa: BLE001 - a broker starting or stopping: no view (yet)
        raise NotYet(f"node {node}: {type(exc).__name__}: {exc}") from exc
    t = resp.topics[0] if resp.topics else None
    if t is None or t.error_code != 0 or not t.partitions:
        raise NotYet(f"node {node}: topic error {t.error_code if t else 'no topic'}")
    p = t.partitions[0]
    return View(node, p.leader_id, p.leader_epoch, tuple(p.isr_nodes), tuple(p.eligible_leader_replicas or ()),
                tuple(p.last_known_elr or ()))


def finalized_elr_level(cluster: ClusterProcesses, node: int) -> int:
    """eligible.leader.replicas.version as broker `node` finalized it (ApiVersions v3)."""
    async def ask() -> Any:
        conn = await BrokerConnection("127.0.0.1", cluster[node].port).connect(timeout_s=3.0)
        try:
            return await conn.request(ApiKey.API_VERSIONS, {"client_software_name": "test",
                                                            "client_software_version": "1"}, version=3)
        finally:
            await conn.aclose()
    resp = trio.run(ask)
    return next((int(f.max_version_level) for f in resp.finalized_features if f.name == ELR_FEATURE), 0)


def views(cluster: ClusterProcesses) -> str:
    """Every running broker's view, for a report."""
    out = []
    for n in sorted(cluster.alive()):
        try:
            out.append(str(describe(cluster, n)))
        except NotYet as exc:
            out.append(str(exc))
    return "; ".join(out)


def controller_logs(cluster: ClusterProcesses, lines: int = 25) -> str:
    return "\n".join(f"---- controller node {n} ----\n" + "\n".join(c.log_text().splitlines()[-lines:])
                     for n, c in cluster.controllers.items())


def wait_view(cluster: ClusterProcesses, *, leader: int, isr: set[int], elr: list[int] | None = None,
              last_known_elr: list[int] | None = None, nodes: tuple[int, ...] = (OBSERVER,),
              timeout_s: float = WAIT_S) -> View:
    """Until every one of `nodes` reports TOPIC-0 with this leader, ISR (as a set), ELR and
    last known ELR (as lists, in the controller's order; None: any); the first node's view.
    On timeout the error shows every running broker's view and the controllers' logs."""
    def reached() -> View:
        seen = [describe(cluster, n) for n in nodes]
        for v in seen:
            if (v.leader != leader or set(v.isr) != isr or (elr is not None and list(v.elr) != elr)
                    or (last_known_elr is not None and list(v.last_known_elr) != last_known_elr)):
                raise NotYet(f"{v} | every broker: {views(cluster)}")
        return seen[0]
    what = (f"nodes {list(nodes)} report {TOPIC}-0 with leader {leader}, ISR {sorted(isr)}"
            + (f", ELR {elr}" if elr is not None else "") + (f", LastKnownElr {last_known_elr}"
                                                             if last_known_elr is not None else ""))
    try:
        return wait_until(reached, timeout_s, what, cluster)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{controller_logs(cluster)}") from None


def active_controller(cluster: ClusterProcesses) -> tuple[int, int]:
    """(node, epoch) of the latest activation any controller node logged."""
    seen = [(int(m.group(2)), int(m.group(1))) for c in cluster.controllers.values()
            for m in ACTIVE.finditer(c.log_text())]
    if not seen:
        raise NotYet("no controller node logged an activation yet")
    epoch, node = max(seen)
    return node, epoch


_T0 = [time.monotonic()]


def note(text: str) -> None:
    """A step of the scenario, with the seconds since the test began."""
    print(f"[{time.monotonic() - _T0[0]:5.1f} s] {text}", flush=True)


def cli(*args: str) -> str:
    """`dcmirror ARGS` (deploy.cli): its stdout, once it exited 0."""
    proc = subprocess.run([sys.executable, "-m", "deploy.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"dcmirror {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def kafka_tool(tools: KafkaTools, cluster: ClusterProcesses, tool: str, *args: str) -> str:
    """One of Apache Kafka's tools against the observer broker: its stdout, once it exited 0."""
    proc = tools.run(tool, "--bootstrap-server", cluster[OBSERVER].bootstrap, *args)
    assert proc.returncode == 0, f"{tool} {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def feature_level(describe_output: str) -> int:
    """eligible.leader.replicas.version's finalized level in `features describe` output
    (kafka-features' or dcmirror's: the same columns)."""
    m = re.search(rf"Feature: {re.escape(ELR_FEATURE)}\s+SupportedMinVersion: 0\s+SupportedMaxVersion: 1\s+"
                  r"FinalizedVersionLevel: (\d+)", describe_output)
    assert m, describe_output
    return int(m.group(1))


# ---- what the clients do ----------------------------------------------------------------------


def produce(bootstrap: str, values: list[int]) -> list[int]:
    """Each value as one record of TOPIC-0 (idempotent, acks=all), all acknowledged: their offsets."""
    return produce_acked(bootstrap, TOPIC, values)


def refused_write(bootstrap: str) -> str:
    """One acks=all write without retries: the error's name (it must fail)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                         "retries": 0, "message.timeout.ms": 15_000, "log_level": 2})
    outcome: list[KafkaError | None] = []
    producer.produce(TOPIC, value=str(PROBE).encode(), partition=0,
                     on_delivery=lambda err, msg: outcome.append(err))
    assert producer.flush(20) == 0 and len(outcome) == 1, "no delivery report for the refused write"
    assert outcome[0] is not None, "an acks=all write was acknowledged with the ISR below min.insync.replicas"
    return str(outcome[0].name())


def records(cluster: ClusterProcesses) -> list[tuple[int, int]]:
    """(offset, value) of every committed record of TOPIC-0, read through the observer."""
    return read_all(cluster[OBSERVER].bootstrap, TOPIC, 1)[0]


def check_acknowledged(got: list[tuple[int, int]], acknowledged: dict[int, int]) -> list[int]:
    """The checker: `got` holds each value at most once, in ascending order; returns the
    acknowledged values (value -> offset) missing or not at their acknowledged offset."""
    values = [v for _, v in got]
    assert len(values) == len(set(values)), f"duplicates: {sorted(v for v in set(values) if values.count(v) > 1)}"
    assert values == sorted(values), "records out of order"
    at = {v: o for o, v in got}
    return [v for v, o in sorted(acknowledged.items()) if at.get(v) != o]


# ---- the machine crash ------------------------------------------------------------------------


def clean_marker_epoch(broker: BrokerProcess) -> int | None:
    """The broker epoch a stopped broker's clean-shutdown marker names (None: no marker)."""
    path = broker.data_dir / CLEAN_SHUTDOWN_FILE
    if not path.exists():
        return None
    return int(orjson.loads(path.read_bytes())["broker_epoch"])


def stop_cleanly(cluster: ClusterProcesses, node: int) -> int:
    """SIGTERM: controlled shutdown, then the clean-shutdown marker with the broker epoch
    the broker ran in; that epoch."""
    broker = cluster[node]
    ready = re.findall(r"broker \d+ is ready \(broker epoch (\d+)", broker.log_text())
    assert broker.stop() == 0, broker.log_text()[-3000:]
    epoch = clean_marker_epoch(broker)
    assert epoch is not None and epoch == int(ready[-1]), (epoch, ready)
    return epoch


def lose_unsynced_tail(broker: BrokerProcess, from_offset: int) -> int:
    """What a machine crash does to a killed broker's TOPIC-0 whose writes from `from_offset`
    on were never fsynced: they are gone. The segment is cut where the batch holding
    `from_offset` starts (its indexes are rebuilt by recovery, which runs as there is no
    clean-shutdown marker). Returns the bytes removed."""
    assert not broker.alive()
    assert clean_marker_epoch(broker) is None, "a killed broker left a clean-shutdown marker"
    recovery_point = read_offset_checkpoint(broker.data_dir / RECOVERY_POINT_FILE, "").get(f"{TOPIC}-0", 0)
    assert recovery_point <= from_offset, f"offsets below {recovery_point} were fsynced: a crash keeps them"
    segments = sorted((broker.data_dir / f"{TOPIC}-0").glob("*.log"))
    assert len(segments) == 1, segments
    data = segments[0].read_bytes()
    pos = 0
    while pos < len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        if base_offset >= from_offset:
            break
        pos += 12 + length
    assert pos < len(data) and base_offset == from_offset, f"no batch starts at {from_offset}"
    os.truncate(segments[0], pos)
    return len(data) - pos


# ---- the common first part --------------------------------------------------------------------


@dataclass
class Crashed:
    acknowledged: dict[int, int]  # value -> offset
    lost_bytes: int
    mark: dict[int, int]  # brokers' log lengths before the restarts


def last_isr_member_crashes(cluster: ClusterProcesses, *, elr: bool) -> Crashed:
    """Steps 1-3 of the module docstring."""
    client = admin(cluster[OBSERVER].bootstrap)
    client.create_topics([NewTopic(TOPIC, 1, replica_assignment=[REPLICAS],
                                   config={"min.insync.replicas": "2"})],
                         operation_timeout=30, request_timeout=30)[TOPIC].result(timeout=30)
    wait_view(cluster, leader=1, isr={1, 2, 3}, elr=[], nodes=(1, OBSERVER))
    acknowledged = dict(zip(BATCH_1, produce(cluster.bootstrap, BATCH_1), strict=True))
    assert list(acknowledged.values()) == BATCH_1
    note("batch 1 acknowledged with the ISR [1, 2, 3]")

    stop_cleanly(cluster, 3)
    wait_view(cluster, leader=1, isr={1, 2}, elr=[], last_known_elr=[], nodes=(1, OBSERVER))
    batch_2 = produce(cluster.bootstrap_of(1, OBSERVER), BATCH_2)
    acknowledged.update(zip(BATCH_2, batch_2, strict=True))
    assert batch_2 == BATCH_2
    assert set(describe(cluster, 1).isr) == {1, 2}  # so broker 2 had batch 2 when it was acknowledged
    note("broker 3 stopped cleanly; batch 2 acknowledged with the ISR [1, 2]")

    stop_cleanly(cluster, 2)
    formed = wait_view(cluster, leader=1, isr={1}, elr=[2] if elr else [], last_known_elr=[], nodes=(1, OBSERVER))
    note(f"after broker 2's clean shutdown: {formed}")
    if elr:
        (row,) = json.loads(cli("topics", "describe", TOPIC, "--json", "--bootstrap", cluster[OBSERVER].bootstrap))
        assert row["min_insync_replicas"] == 2
        assert [{k: p[k] for k in ("leader", "isr", "elr", "last_known_elr")} for p in row["partitions"]] == [
            {"leader": 1, "isr": [1], "elr": [2], "last_known_elr": []}], row
    assert refused_write(cluster.bootstrap_of(1, OBSERVER)) == "NOT_ENOUGH_REPLICAS"

    cluster[1].kill9()
    if elr:
        crashed = wait_view(cluster, leader=-1, isr=set(), elr=[2, 1], last_known_elr=[1])
    else:
        crashed = wait_view(cluster, leader=-1, isr={1}, elr=[], last_known_elr=[])
    note(f"after broker 1's kill -9: {crashed}")
    lost = lose_unsynced_tail(cluster[1], BATCH_2[0])
    note(f"broker 1's segment cut at offset {BATCH_2[0]}: {lost} bytes of batch 2 gone")
    return Crashed(acknowledged, lost, log_mark(cluster))


def recovered_end(cluster: ClusterProcesses, node: int, mark: dict[int, int]) -> list[int]:
    return [int(m.group(1)) for m in RECOVERED.finditer(log_since(cluster, node, mark))]


def truncations(cluster: ClusterProcesses, node: int, mark: dict[int, int]) -> list[tuple[int, int]]:
    return [(int(m.group(3)), int(m.group(4))) for m in TRUNCATED.finditer(log_since(cluster, node, mark))
            if int(m.group(1)) == node and m.group(2) == f"{TOPIC}-0"]


def start_cluster(clusters: Callable[..., ClusterProcesses]) -> ClusterProcesses:
    # Internal topics of one partition each: fewer partitions to load at every restart.
    return clusters(4, controllers=3, offsets_topic_num_partitions=1, transaction_state_log_num_partitions=1)


# ---- the tests --------------------------------------------------------------------------------


def test_elr_keeps_acknowledged_records(clusters: Callable[..., ClusterProcesses], kafka_tools: KafkaTools) -> None:
    _T0[0] = time.monotonic()
    cluster = start_cluster(clusters)
    note("cluster started")
    assert feature_level(cli("features", "describe", "--bootstrap", cluster[OBSERVER].bootstrap)) == 1
    crashed = last_isr_member_crashes(cluster, elr=True)

    # Scenario C: the active controller dies with the ELR formed; a new one carries it on.
    old, old_epoch = wait_until(lambda: active_controller(cluster), WAIT_S, "an active controller", cluster)
    cluster.controllers[old].kill9()

    def taken_over() -> tuple[int, int]:
        node, epoch = active_controller(cluster)
        if node == old or epoch <= old_epoch:
            raise NotYet(f"node {node} (epoch {epoch}) is the latest active controller")
        return node, epoch
    new, new_epoch = wait_until(taken_over, WAIT_S, "another controller node to take over", cluster)
    note(f"active controller {old} (epoch {old_epoch}) killed; {new} took over (epoch {new_epoch})")
    wait_view(cluster, leader=-1, isr=set(), elr=[2, 1], last_known_elr=[1])

    # Broker 1 comes back first without a clean-shutdown marker: unclean, out of the ELR.
    cluster[1].start()
    assert recovered_end(cluster, 1, crashed.mark) == [BATCH_2[0]], log_since(cluster, 1, crashed.mark)
    back = wait_view(cluster, leader=-1, isr=set(), elr=[2], nodes=(1, OBSERVER))
    note(f"broker 1 back (unclean, {crashed.lost_bytes} bytes of batch 2 lost): {back}")
    # Broker 3 next: clean, but never eligible (it lacks batch 2).
    cluster[3].start()
    back = wait_view(cluster, leader=-1, isr=set(), elr=[2], nodes=(1, 3, OBSERVER))
    note(f"broker 3 back: {back}")
    described = kafka_tool(kafka_tools, cluster, "kafka-topics", "--describe", "--topic", TOPIC)
    assert re.search(r"Partition: 0\s+Leader: none\s+Replicas: 1,2,3\s+Isr: \s*Elr: 2\s+LastKnownElr: 1",
                     described), described
    ours = cli("topics", "describe", TOPIC, "--bootstrap", cluster[OBSERVER].bootstrap)
    # dcmirror's partition line is Kafka's (plus the offline replicas Kafka 4 no longer prints)
    assert ours.splitlines()[1].split("\tOffline: ")[0] == described.splitlines()[1], (ours, described)
    assert describe(cluster, OBSERVER).leader == -1, "a replica without batch 2 was elected"
    note("kafka-topics --describe and dcmirror topics describe (Leader: none): Isr empty, Elr 2")

    # Broker 2, eligible, comes back: it leads, the others catch up from it.
    cluster[2].start()
    led = wait_view(cluster, leader=2, isr={1, 2, 3}, elr=[], last_known_elr=[], nodes=(1, 2, 3, OBSERVER))
    note(f"broker 2 back: {led}")
    got = records(cluster)
    assert check_acknowledged(got, crashed.acknowledged) == [], "acknowledged records lost with ELR on"
    assert [v for _, v in got] == BATCH_1 + BATCH_2  # exactly once, in order; the refused write is not there
    assert truncations(cluster, 1, crashed.mark) == [] and truncations(cluster, 3, crashed.mark) == []
    note("every acknowledged record read back once, in order")
    report = verify_replicas(cluster, TOPIC)
    assert sorted((r["broker_id"], r["log_end_offset"]) for r in report[0]["replicas"]) == [(1, 200), (2, 200),
                                                                                           (3, 200)], report
    # The changes after the failover are the new controller's, from the ELR it read in the log.
    assert active_controller(cluster) == (new, new_epoch)
    note(f"ELR kept all {len(crashed.acknowledged)} acknowledged records")


def test_without_elr_the_crashed_leader_leads_and_batch_2_is_lost(clusters: Callable[..., ClusterProcesses],
                                                                  kafka_tools: KafkaTools) -> None:
    _T0[0] = time.monotonic()
    cluster = start_cluster(clusters)
    note("cluster started")
    assert feature_level(kafka_tool(kafka_tools, cluster, "kafka-features", "describe")) == 1
    out = kafka_tool(kafka_tools, cluster, "kafka-features", "downgrade", "--feature", f"{ELR_FEATURE}=0")
    assert f"{ELR_FEATURE} was downgraded to 0." in out, out
    assert feature_level(kafka_tool(kafka_tools, cluster, "kafka-features", "describe")) == 0
    # every broker applied it before the scenario starts (strict min ISR off, no ELR kept)
    wait_until(lambda: all(finalized_elr_level(cluster, n) == 0 for n in cluster.brokers), WAIT_S,
               f"every broker reports {ELR_FEATURE} 0", cluster)
    note(f"{ELR_FEATURE} downgraded to 0 with kafka-features; every broker applied it")
    crashed = last_isr_member_crashes(cluster, elr=False)

    # Broker 1, the last ISR member, comes back first: it leads again on what it kept.
    cluster[1].start()
    assert recovered_end(cluster, 1, crashed.mark) == [BATCH_2[0]], log_since(cluster, 1, crashed.mark)
    led = wait_view(cluster, leader=1, isr={1}, elr=[], nodes=(1, OBSERVER))
    note(f"broker 1 back without ELR: {led}")
    cluster[3].start()
    cluster[2].start()
    whole = wait_view(cluster, leader=1, isr={1, 2, 3}, elr=[], nodes=(1, 2, 3, OBSERVER))
    note(f"brokers 3 and 2 back: {whole}")
    # Broker 2 held batch 2 and had to cut it to follow broker 1.
    assert truncations(cluster, 2, crashed.mark) == [(200, 100)], log_since(cluster, 2, crashed.mark)
    got = records(cluster)
    assert check_acknowledged(got, crashed.acknowledged) == BATCH_2, "without ELR batch 2 was expected lost"
    assert [v for _, v in got] == BATCH_1
    note("batch 2 lost: the checker reports its 100 acknowledged records missing")
    report = verify_replicas(cluster, TOPIC)
    assert sorted((r["broker_id"], r["log_end_offset"]) for r in report[0]["replicas"]) == [(1, 100), (2, 100),
                                                                                           (3, 100)], report

    note("verify-replicas: the three replicas identical")
    out = kafka_tool(kafka_tools, cluster, "kafka-features", "upgrade", "--feature", f"{ELR_FEATURE}=1")
    assert f"{ELR_FEATURE} was upgraded to 1." in out, out
    assert feature_level(kafka_tool(kafka_tools, cluster, "kafka-features", "describe")) == 1
    assert feature_level(cli("features", "describe", "--bootstrap", cluster[OBSERVER].bootstrap)) == 1
    note(f"without ELR the {len(BATCH_2)} records of batch 2 were lost, as expected")

