"""`dcmirror demo`: for now a standalone broker with a real Kafka client doing a round trip.

The full multi-datacenter demo (mirrors, warehouse load) replaces this as those parts land.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOPIC = "pageviews"
PARTITIONS = 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"broker did not listen on port {port} within {timeout_s} s")


def run_demo(records: int = 100_000) -> int:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        print("dcmirror demo uses confluent-kafka as its client: pip install 'dcmirror[test]' (make demo does)",
              file=sys.stderr)
        return 2

    workdir = Path(tempfile.mkdtemp(prefix="dcmirror-demo-"))
    port = _free_port()
    bootstrap = f"127.0.0.1:{port}"
    log_path = workdir / "broker.log"
    print(f"== dcmirror demo: standalone broker on {bootstrap}, data in {workdir / 'data'}")
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "broker", "--data-dir", str(workdir / "data"), "--listen", bootstrap],
            stdout=log_file, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    try:
        _wait_listening(port, proc, 30)
        # Clients live in their own frame so they are gone before the broker stops.
        return _workload(bootstrap, records)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        print(f"broker stopped (exit {proc.returncode}); its log: {log_path}")
        if proc.returncode == 0:
            shutil.rmtree(workdir / "data", ignore_errors=True)


def _workload(bootstrap: str, records: int) -> int:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=10)
    print(f"created topic {TOPIC} with {PARTITIONS} partitions (Kafka CreateTopics via librdkafka)")

    delivered = 0
    failed = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal delivered, failed
        if err is None:
            delivered += 1
        else:
            failed += 1

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                         "compression.type": "lz4"})
    start = time.monotonic()
    for i in range(records):
        key = f"user-{i % 997}".encode()
        value = f'{{"dc":"east","page":"/p/{i % 50}","seq":{i}}}'.encode()
        while True:
            try:
                producer.produce(TOPIC, key=key, value=value, headers=[("source", b"demo")],
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)
    produce_s = time.monotonic() - start
    print(f"produced {delivered} records ({failed} failed) in {produce_s:.2f} s "
          f"= {delivered / produce_s:,.0f} records/s (idempotent, lz4)")

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo", "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    seen: set[bytes] = set()
    per_partition = [0] * PARTITIONS
    start = time.monotonic()
    while len(seen) < delivered and time.monotonic() - start < 60:
        for msg in consumer.consume(10_000, 0.5):
            if msg.error():
                continue
            seen.add(msg.value() or b"")
            per_partition[msg.partition() or 0] += 1
    consume_s = time.monotonic() - start
    ends = [consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=5)[1] for p in range(PARTITIONS)]
    consumer.close()
    print(f"consumed {len(seen)} distinct records in {consume_s:.2f} s = {len(seen) / consume_s:,.0f} records/s")
    print("per partition (consumed / log end offset): "
          + ", ".join(f"p{p}={per_partition[p]}/{ends[p]}" for p in range(PARTITIONS)))
    ok = len(seen) == delivered == records and sum(ends) == records
    print("RESULT:", "every record produced was consumed exactly once" if ok else "MISMATCH")
    producer.flush(1)
    del producer, admin
    return 0 if ok else 1
