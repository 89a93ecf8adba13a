"""Broker admin HTTP against real broker processes and real Kafka clients (librdkafka):
/metrics parses with prometheus_client and its counters move exactly with the traffic,
/healthz, /v1/cluster, and under-replicated partitions and ISR changes on a 3-broker
cluster that loses a broker."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.cluster_helpers import create_topic, wait_until
from tests.harness import REPO, BrokerProcess, ClusterProcesses, free_port
from tests.ops.common import cluster_view, get, scrape, value


def _produce(bootstrap: str, topic: str, n: int) -> None:
    delivered: list[object] = []
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=b"v%06d" % i + b"x" * 90, key=b"k%d" % (i % 97),
                  on_delivery=lambda err, msg: delivered.append(err))
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    assert delivered == [None] * n


def _consume_all(bootstrap: str, topic: str, partitions: int, n: int) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ops-metrics", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got = 0
        deadline = time.monotonic() + 30
        while got < n and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                assert m.error() is None, m.error()
                got += 1
        return got
    finally:
        c.close()


def _log_bytes(data_dir: Path, topic: str) -> int:
    return sum(f.stat().st_size for f in data_dir.glob(f"{topic}-*/*.log"))


def test_metrics_move_with_traffic(tmp_path: Path) -> None:
    # Admin HTTP at the Kafka port + admin.http.port.offset (two free ports, the lower for Kafka).
    kafka_port, http_port = sorted((free_port(), free_port()))
    broker = BrokerProcess(tmp_path / "broker", kafka_port,
                           **{"admin.http.port.offset": http_port - kafka_port}).start()
    base = f"http://127.0.0.1:{http_port}"
    try:
        assert get(base + "/healthz")[::2] == (200, b"ok\n")
        status, _, body = get(base + "/nothing")
        assert status == 404 and b"/metrics" in body
        create_topic(broker.bootstrap, "pageviews", 3, 1)
        before = scrape(base)
        assert value(before, "dcmirror_broker_records_in_total", topic="pageviews") == 0
        produce_count = value(before, "dcmirror_broker_request_latency_seconds_count", api="Produce")

        n = 5000
        _produce(broker.bootstrap, "pageviews", n)
        after = scrape(base)
        assert value(after, "dcmirror_broker_records_in_total", topic="pageviews") == n
        # Batches are appended as they came: the bytes counted in are the log's bytes.
        bytes_in = value(after, "dcmirror_broker_bytes_in_total", topic="pageviews")
        assert bytes_in == _log_bytes(broker.data_dir, "pageviews") > n * 96
        assert value(after, "dcmirror_broker_produce_errors_total", topic="pageviews") == 0
        requests = value(after, "dcmirror_broker_request_latency_seconds_count", api="Produce")
        assert requests > produce_count
        buckets = sorted(((float(dict(ls)["le"]), v) for (name, ls), v in after.items()
                          if name == "dcmirror_broker_request_latency_seconds_bucket"
                          and ("api", "Produce") in ls), key=lambda b: b[0])
        assert buckets[-1] == (float("inf"), requests)
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:], strict=False)), buckets
        assert value(after, "dcmirror_broker_request_latency_seconds_sum", api="Produce") > 0

        assert _consume_all(broker.bootstrap, "pageviews", 3, n) == n
        read = scrape(base)
        assert value(read, "dcmirror_broker_records_out_total", topic="pageviews") == n
        assert value(read, "dcmirror_broker_bytes_out_total", topic="pageviews") == bytes_in
        assert value(read, "dcmirror_broker_request_latency_seconds_count", api="Fetch") > 0
        assert value(read, "dcmirror_controller_active") == 1
        assert value(read, "dcmirror_broker_under_replicated_partitions") == 0
        assert value(read, "dcmirror_broker_ready") == 1

        view = cluster_view(base)
        assert {k: view[k] for k in ("node_id", "cluster_id", "controller_id", "active_controller", "ready",
                                     "under_replicated", "offline")} == {
            "node_id": 1, "cluster_id": "dcmirror-standalone", "controller_id": 1, "active_controller": True,
            "ready": True, "under_replicated": [], "offline": []}
        assert [(b["node_id"], b["port"], b["fenced"]) for b in view["brokers"]] == [(1, kafka_port, False)]
        # pageviews and the 50 of __consumer_offsets, all led here.
        assert view["partitions_led"] == view["partitions_replicated"] == view["partitions"] == 3 + 50
        assert value(read, "dcmirror_broker_leader_partitions") == view["partitions_led"]
    finally:
        broker.stop()


def test_admin_http_settings_are_checked(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "broker", "--data-dir", str(tmp_path / "b"), "--listen",
         f"127.0.0.1:{free_port()}", "--set", f"admin.http.listener=127.0.0.1:{free_port()}",
         "--set", "admin.http.port.offset=5"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "set admin.http.listener or admin.http.port.offset, not both" in proc.stderr

    # A taken port is named, and the data directory is left alone (no clean-shutdown marker).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "deploy.cli", "broker", "--data-dir", str(tmp_path / "c"), "--listen",
             f"127.0.0.1:{free_port()}", "--set", f"admin.http.listener=127.0.0.1:{port}"],
            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"dcmirror broker: [Errno 98] admin HTTP listener 127.0.0.1:{port}: Address already in use")
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_under_replicated_partitions_after_a_broker_dies(tmp_path: Path) -> None:
    cluster = ClusterProcesses(tmp_path / "cluster", 3, **{"replica.lag.time.max.ms": 1500,
                                                            "offsets.topic.num.partitions": 3})
    bases = {}
    for node_id, b in cluster.brokers.items():
        port = free_port()
        b.overrides["admin.http.listener"] = f"127.0.0.1:{port}"
        bases[node_id] = f"http://127.0.0.1:{port}"
    cluster.start()
    try:
        create_topic(cluster.bootstrap, "clicks", 3, 3)
        _produce(cluster.bootstrap, "clicks", 300)

        def totals(nodes: list[int]) -> dict[str, float]:
            samples = [scrape(bases[i]) for i in nodes]
            return {k: sum(value(s, k) for s in samples) for k in (
                "dcmirror_broker_under_replicated_partitions", "dcmirror_broker_isr_shrinks_total",
                "dcmirror_broker_isr_expands_total", "dcmirror_controller_active",
                "dcmirror_broker_leader_partitions")}

        healthy = wait_until(lambda: (t := totals([1, 2, 3]))["dcmirror_broker_under_replicated_partitions"] == 0
                             and t["dcmirror_broker_leader_partitions"] == 6 and t, 30,
                             "every partition led, none under-replicated", cluster)
        assert healthy["dcmirror_controller_active"] == 1
        records_in = sum(value(scrape(bases[i]), "dcmirror_broker_records_in_total", topic="clicks")
                         for i in (1, 2, 3))
        assert records_in == 300  # counted by the leaders only, not by the followers' appends
        partitions = cluster_view(bases[1])["partitions"]
        assert partitions == 6  # clicks and __consumer_offsets, 3 each, every one with broker 3
        shrinks = totals([1, 2])["dcmirror_broker_isr_shrinks_total"]

        cluster[3].kill9()
        # Every partition has a replica on broker 3: each is led elsewhere with a smaller ISR.
        degraded = wait_until(lambda: (t := totals([1, 2]))["dcmirror_broker_under_replicated_partitions"]
                              == partitions and t, 30, "every partition under-replicated on 1 and 2", cluster)
        # Once 3 is fenced the controller takes it out of every ISR (the leaders would have after
        # replica.lag.time.max.ms): each partition's ISR shrank once, counted by its leader.
        assert degraded["dcmirror_broker_isr_shrinks_total"] - shrinks == partitions
        assert degraded["dcmirror_controller_active"] == 1
        view = cluster_view(bases[1])
        assert all(3 not in p["isr"] and 3 in p["replicas"] for p in view["under_replicated"])

        cluster[3].start()
        back = wait_until(lambda: (t := totals([1, 2, 3]))["dcmirror_broker_under_replicated_partitions"] == 0
                          and t, 60, "broker 3 back in every ISR", cluster)
        # At least once per partition (a follower that falls behind again while catching up
        # leaves and rejoins: more).
        assert back["dcmirror_broker_isr_expands_total"] >= partitions
    finally:
        cluster.stop()


def test_histogram_buckets_and_batch_record_counts() -> None:
    from cluster.broker.metrics import LATENCY_BUCKETS_S, Histogram
    from cluster.protocol.record_batch import scan_batches
    from cluster.protocol.records import append_record, batch_from_records_section

    h = Histogram()
    for seconds in (0.0001, 0.0005, 0.0006, 0.05, 99.0):
        h.observe(seconds)
    cumulative = {labels["le"]: v for suffix, labels, v in h.samples({}) if suffix == "_bucket"}
    # A value equal to a bound falls in that bucket (Prometheus' `le`).
    assert (cumulative["0.0005"], cumulative["0.001"], cumulative["0.05"], cumulative["30.0"],
            cumulative["+Inf"]) == (2, 3, 4, 4, 5)
    assert len(cumulative) == len(LATENCY_BUCKETS_S) + 1 and h.count == 5

    def batch(n: int) -> bytes:
        body = bytearray()
        for i in range(n):
            append_record(body, i, 0, None, b"v%d" % i, ())
        return batch_from_records_section(bytes(body), count=n, base_offset=0, last_offset_delta=n - 1,
                                          base_timestamp=0, max_timestamp=0)

    data = batch(3) + batch(1) + batch(7)
    assert scan_batches(data).records == 11
    assert scan_batches(data[:-5]).records == 4  # a partial trailing batch is not counted
    assert scan_batches(b"").records == 0
