"""`dcmirror reassign|topics|elect-leaders` against a real 3-broker topology cluster.

Reassignment changes a topic's replication factor 1 → 3 → 2 with data in it: the new
replicas copy the partition from the leader, join the ISR, the reassignment completes,
removed replicas delete their logs, and every remaining replica is byte-identical.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.harness import REPO, ClusterProcesses

TOPIC = "moved"
RECORDS_PER_PARTITION = 400


def dcmirror(cluster: ClusterProcesses, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "deploy.cli", *args, "--config", str(cluster.topology_path),
           "--cluster", cluster.name]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def describe(cluster: ClusterProcesses, topic: str) -> dict[int, dict[str, object]]:
    out = dcmirror(cluster, "topics", "describe", topic, "--json").stdout
    (row,) = json.loads(out)
    return {p["partition"]: p for p in row["partitions"]}


def wait_until(predicate: object, timeout_s: float, what: str, cluster: ClusterProcesses) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{cluster.logs()}")


def partition_bytes(cluster: ClusterProcesses, node: int, partition: int) -> bytes | None:
    directory = cluster[node].data_dir / f"{TOPIC}-{partition}"
    if not directory.exists():
        return None
    return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))


def produce(bootstrap: str, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})
    for p in range(partitions):
        for i in range(RECORDS_PER_PARTITION):
            producer.produce(TOPIC, value=f"{p}:{i}".encode(), partition=p)
    assert producer.flush(30) == 0


def consume_all(bootstrap: str, partitions: int) -> dict[int, list[bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify", "enable.auto.commit": False,
                         "fetch.queue.backoff.ms": 10})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
    got: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + 30
    while sum(map(len, got.values())) < partitions * RECORDS_PER_PARTITION and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got[msg.partition()].append(msg.value())
    consumer.close()
    return got


def write_plan(path: Path, replicas: dict[int, list[int]]) -> Path:
    path.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": TOPIC, "partition": p, "replicas": r} for p, r in sorted(replicas.items())]}))
    return path


def test_reassign_changes_replication_factor_1_to_3_to_2(tmp_path: Path, cluster_factory: object) -> None:
    cluster: ClusterProcesses = cluster_factory(3)  # type: ignore[operator]
    dcmirror(cluster, "topics", "create", TOPIC, "--partitions", "2", "--replication-factor", "1",
             "--replica-assignment", "1,2")
    assert {p: d["replicas"] for p, d in describe(cluster, TOPIC).items()} == {0: [1], 1: [2]}
    produce(cluster.bootstrap, 2)

    # generate proposes the seeds' rule over the given brokers and the new factor.
    gen = dcmirror(cluster, "reassign", "generate", "--topics", TOPIC, "--brokers", "1,2,3",
                   "--replication-factor", "3", "--seed", "7", "--output", str(tmp_path / "gen.json")).stdout
    assert "Proposed partition reassignment configuration" in gen
    proposed = {e["partition"]: e["replicas"] for e in json.loads((tmp_path / "gen.json").read_text())["partitions"]}
    assert sorted(proposed) == [0, 1] and all(sorted(r) == [1, 2, 3] for r in proposed.values())
    assert proposed[1] == [proposed[0][(i + 1) % 3] for i in range(3)]  # consecutive partitions shift by one

    # 1 → 3: the current leaders stay first, so leadership does not move.
    up = write_plan(tmp_path / "rf3.json", {0: [1, 2, 3], 1: [2, 3, 1]})
    out = dcmirror(cluster, "reassign", "execute", "--reassignment-json-file", str(up)).stdout
    assert '"replicas": [1]' in out and "Successfully started" in out
    wait_until(lambda: dcmirror(cluster, "reassign", "verify", "--reassignment-json-file", str(up),
                                check=False).returncode == 0, 60, "the RF 3 reassignment to complete", cluster)
    state = describe(cluster, TOPIC)
    assert state[0]["replicas"] == [1, 2, 3] and sorted(state[0]["isr"]) == [1, 2, 3] and state[0]["leader"] == 1
    assert state[1]["replicas"] == [2, 3, 1] and sorted(state[1]["isr"]) == [1, 2, 3] and state[1]["leader"] == 2
    for p in (0, 1):
        copies = {n: partition_bytes(cluster, n, p) for n in (1, 2, 3)}
        assert copies[1] and copies[1] == copies[2] == copies[3], f"partition {p} replicas differ"

    # 3 → 2, dropping broker 1, which leads partition 0: leadership moves to the new first replica.
    down = write_plan(tmp_path / "rf2.json", {0: [3, 2], 1: [2, 3]})
    dcmirror(cluster, "reassign", "execute", "--reassignment-json-file", str(down))
    wait_until(lambda: dcmirror(cluster, "reassign", "verify", "--reassignment-json-file", str(down),
                                check=False).returncode == 0, 60, "the RF 2 reassignment to complete", cluster)
    state = describe(cluster, TOPIC)
    assert {p: (d["replicas"], sorted(d["isr"]), d["leader"]) for p, d in state.items()} == {
        0: ([3, 2], [2, 3], 3), 1: ([2, 3], [2, 3], 2)}
    wait_until(lambda: partition_bytes(cluster, 1, 0) is None and partition_bytes(cluster, 1, 1) is None, 30,
               "broker 1 to delete the replicas it no longer holds", cluster)
    for p in (0, 1):
        assert partition_bytes(cluster, 2, p) == partition_bytes(cluster, 3, p)

    got = consume_all(cluster.bootstrap, 2)
    assert got == {p: [f"{p}:{i}".encode() for i in range(RECORDS_PER_PARTITION)] for p in (0, 1)}
    assert dcmirror(cluster, "reassign", "verify", "--reassignment-json-file", str(up),
                    check=False).returncode == 1  # the earlier plan no longer matches


def test_reassign_rejects_unknown_brokers_and_cancel_without_move(tmp_path: Path, cluster_factory: object) -> None:
    cluster: ClusterProcesses = cluster_factory(3)  # type: ignore[operator]
    dcmirror(cluster, "topics", "create", TOPIC, "--partitions", "1", "--replication-factor", "2")
    bad = write_plan(tmp_path / "bad.json", {0: [1, 9]})
    proc = dcmirror(cluster, "reassign", "execute", "--reassignment-json-file", str(bad), check=False)
    assert proc.returncode == 1
    assert "INVALID_REPLICA_ASSIGNMENT" in proc.stderr and "[9] are not registered" in proc.stderr
    dup = write_plan(tmp_path / "dup.json", {0: [2, 2]})
    proc = dcmirror(cluster, "reassign", "execute", "--reassignment-json-file", str(dup), check=False)
    assert proc.returncode == 1 and "appears twice" in proc.stderr
    cancel = dcmirror(cluster, "reassign", "cancel", "--reassignment-json-file", str(bad)).stdout
    assert "NO_REASSIGNMENT_IN_PROGRESS" in cancel
    assert "Status" in dcmirror(cluster, "reassign", "verify", "--reassignment-json-file", str(bad),
                                check=False).stdout


def test_topics_cli_create_alter_describe_delete(cluster_factory: object) -> None:
    cluster: ClusterProcesses = cluster_factory(3)  # type: ignore[operator]
    out = dcmirror(cluster, "topics", "create", "events", "--partitions", "3", "--replication-factor", "3",
                   "--set", "retention.ms=60000").stdout
    assert out.strip() == "Created topic events."
    again = dcmirror(cluster, "topics", "create", "events", "--partitions", "3", check=False)
    assert again.returncode == 2 and "TOPIC_ALREADY_EXISTS" in again.stderr
    assert dcmirror(cluster, "topics", "create", "events", "--if-not-exists").returncode == 0
    state = describe(cluster, "events")
    # The seeds' rule: consecutive partitions start one broker further; replicas never repeat.
    firsts = [state[p]["replicas"][0] for p in range(3)]  # type: ignore[index]
    assert sorted(firsts) == [1, 2, 3]
    for p in range(3):
        replicas = state[p]["replicas"]
        assert sorted(replicas) == [1, 2, 3] and state[p]["leader"] == replicas[0]  # type: ignore[index]
    # kafka-topics' form too: --config KEY=VALUE is a topic config beside the topology --config FILE
    dcmirror(cluster, "topics", "alter", "events", "--partitions", "5", "--set", "retention.ms=1000",
             "--config", "cleanup.policy=compact")
    (row,) = json.loads(dcmirror(cluster, "topics", "describe", "events", "--json").stdout)
    assert row["partition_count"] == 5 and row["replication_factor"] == 3
    assert row["configs"] == {"retention.ms": "1000", "cleanup.policy": "compact"}
    dcmirror(cluster, "topics", "alter", "events", "--unset", "cleanup.policy")
    (row,) = json.loads(dcmirror(cluster, "topics", "describe", "events", "--json").stdout)
    assert row["configs"] == {"retention.ms": "1000"}
    shrink = dcmirror(cluster, "topics", "alter", "events", "--partitions", "2", check=False)
    assert shrink.returncode == 2 and "INVALID_PARTITIONS" in shrink.stderr
    assert "events" in dcmirror(cluster, "topics", "list").stdout.split()
    dcmirror(cluster, "topics", "delete", "events")
    assert "events" not in dcmirror(cluster, "topics", "list").stdout.split()
    wait_until(lambda: not any((cluster[n].data_dir / "events-0").exists() for n in (1, 2, 3)), 30,
               "every broker to delete the topic's logs", cluster)
