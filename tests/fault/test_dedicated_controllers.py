"""A cluster with dedicated controller nodes (`controllers = [...]` in the topology).

The three controllers are the metadata quorum; the three brokers follow the metadata log
as observers and host every partition. Killing the active controller moves the controller
role to another controller node; brokers keep working and are still fenced when they die.
"""

from __future__ import annotations

import re
import socket
import struct
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.harness import ClusterProcesses

ACTIVE = re.compile(r"node (\d+) is the active controller \(epoch (\d+)")


def active_controller(cluster: ClusterProcesses) -> tuple[int, int]:
    """(node, epoch) of the latest activation logged by any controller node."""
    seen = [(int(m.group(2)), int(m.group(1))) for c in cluster.controllers.values()
            for m in ACTIVE.finditer(c.log_text())]
    assert seen, cluster.logs()
    epoch, node = max(seen)
    return node, epoch


def wait_until(predicate: object, timeout_s: float, what: str, cluster: ClusterProcesses) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()  # type: ignore[operator]
            if value:
                return value
        except Exception:  # noqa: BLE001 - client errors while the cluster changes count as "not yet"
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}\n{cluster.logs()}")


def create(bootstrap: str, name: str, partitions: int, rf: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, rf)], operation_timeout=30)[name].result(60)


def test_dedicated_controllers_run_the_quorum_and_fail_over(cluster_factory: object) -> None:
    cluster: ClusterProcesses = cluster_factory(3, controllers=3)  # type: ignore[operator]
    assert sorted(cluster.controllers) == [4, 5, 6]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    # Clients see the brokers only (once every broker's unfencing reached the one answering);
    # the controller id they get is a broker, as in KRaft.
    md = wait_until(lambda: (lambda m: m if sorted(m.brokers) == [1, 2, 3] else None)(admin.list_topics(timeout=10)),
                    30, "Metadata listing brokers 1, 2, 3", cluster)
    assert sorted(md.brokers) == [1, 2, 3]  # type: ignore[attr-defined]
    assert md.controller_id in (1, 2, 3)  # type: ignore[attr-defined]
    controller, epoch = active_controller(cluster)
    assert controller in (4, 5, 6)
    for b in cluster.brokers.values():
        assert "quorum observer" in b.log_text()

    create(cluster.bootstrap, "events", 3, 3)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(60):
        producer.produce("events", value=b"%d" % i, partition=i % 3)
    assert producer.flush(30) == 0

    # A Kafka client talking to a controller node is turned away (connection closed).
    with socket.create_connection(("127.0.0.1", cluster.controllers[controller].port), timeout=5) as s:
        header = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
        s.sendall(struct.pack(">i", len(header)) + header)
        assert s.recv(16) == b""

    cluster.controllers[controller].kill9()
    new, new_epoch = wait_until(
        lambda: (lambda c: c if c[0] != controller and c[1] > epoch else None)(active_controller(cluster)),
        15, "another controller node to take over", cluster)  # type: ignore[misc]
    assert new in (4, 5, 6) and new_epoch > epoch
    create(cluster.bootstrap, "after-failover", 2, 2)

    # Brokers are still fenced by the new controller: kill one, its partitions move.
    victim = 2
    cluster[victim].kill9()

    def moved() -> bool:
        md = AdminClient({"bootstrap.servers": cluster.bootstrap_of(1, 3)}).list_topics("events", timeout=10)
        parts = md.topics["events"].partitions.values()
        return all(p.leader in (1, 3) and victim not in p.isrs for p in parts)

    wait_until(moved, 20, f"every partition of 'events' led by a live broker without {victim} in its ISR", cluster)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_of(1, 3), "group.id": "check",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition("events", p, 0) for p in range(3)])
    got: dict[int, list[int]] = {0: [], 1: [], 2: []}
    deadline = time.monotonic() + 30
    while sum(map(len, got.values())) < 60 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got[msg.partition()].append(int(msg.value()))
    consumer.close()
    assert got == {p: list(range(p, 60, 3)) for p in range(3)}
