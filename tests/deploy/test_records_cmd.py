"""`dcmirror produce` and `dcmirror consume` (issue 41) against a topology cluster by name,
checked with librdkafka: keys, headers, partitions and offsets as sent; consume's offsets
(beginning, -N, @time, stored in a group), bounded runs, JSON and text output; bad input
refused with a message and exit 1, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.harness import REPO, ClusterProcesses

TOPIC = "orders"


def cli(cluster: ClusterProcesses, *args: str, stdin: bytes = b"", timeout_s: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args, "--config", str(cluster.topology_path),
                           "--cluster", cluster.name], cwd=REPO, input=stdin, capture_output=True, timeout=timeout_s)


def read_all(bootstrap: str, partitions: int) -> list[Any]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False,
                  "log_level": 2})
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in range(partitions)}
        c.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < sum(ends.values()) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m)
        return sorted(got, key=lambda m: (m.partition(), m.offset()))
    finally:
        c.close()


def test_produce_and_consume_as_rpk_and_kcat(cluster_factory: Callable[..., ClusterProcesses]) -> None:
    cluster = cluster_factory(1)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(30)

    # Lines with keys (-K:), a header on every record, one partition for all.
    done = cli(cluster, "produce", "--topic", TOPIC, "-K", ":", "-H", "origin=cli", "-p", "1", "--print-offsets",
               stdin=b"k1:hello\nk2:world:with colon\nk3:\n")
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().splitlines() == ["partition 1 offset 0", "partition 1 offset 1", "partition 1 offset 2"]
    assert "produced 3 record(s) to orders" in done.stderr.decode()
    # JSON lines: key, value, headers and a partition of their own.
    lines = [{"key": "j1", "value": "v1", "headers": {"h": "x"}, "partition": 0},
             {"key": None, "value": "no key", "partition": 0}]
    done = cli(cluster, "produce", "--topic", TOPIC, "--format", "json",
               stdin="".join(json.dumps(x) + "\n" for x in lines).encode())
    assert done.returncode == 0, done.stderr.decode()

    got = read_all(cluster.bootstrap, 2)
    assert [(m.partition(), m.offset(), m.key(), m.value(), m.headers()) for m in got] == [
        (0, 0, b"j1", b"v1", [("h", b"x")]),
        (0, 1, None, b"no key", None),
        (1, 0, b"k1", b"hello", [("origin", b"cli")]),
        (1, 1, b"k2", b"world:with colon", [("origin", b"cli")]),
        (1, 2, b"k3", b"", [("origin", b"cli")]),
    ]

    # Bounded (-e): everything, as JSON.
    read = cli(cluster, "consume", "--topic", TOPIC, "-e", "--format", "json")
    assert read.returncode == 0, read.stderr.decode()
    docs = [json.loads(line) for line in read.stdout.decode().splitlines()]
    assert sorted((d["partition"], d["offset"], d["key"], d["value"]) for d in docs) == [
        (0, 0, "j1", "v1"), (0, 1, None, "no key"), (1, 0, "k1", "hello"), (1, 1, "k2", "world:with colon"),
        (1, 2, "k3", "")]
    assert next(d for d in docs if d["key"] == "k1")["headers"] == {"origin": "cli"}
    # The last one of partition 1 (-o -1), as KEY<TAB>VALUE text.
    read = cli(cluster, "consume", "--topic", TOPIC, "-p", "1", "-o", "-1", "-e", "-K", "\t")
    assert read.stdout.decode() == "k3\t\n"
    # From a time after everything: nothing, and it ends (-e).
    future = str(int(time.time() * 1000) + 3_600_000)
    read = cli(cluster, "consume", "--topic", TOPIC, "-o", "@" + future, "-e")
    assert read.returncode == 0 and read.stdout == b""
    # Following, stopped after 2 records (-n), in a group that commits: the next reads on.
    read = cli(cluster, "consume", "--topic", TOPIC, "-p", "1", "-g", "cli-group", "-n", "2")
    assert read.stdout.decode().splitlines() == ["hello", "world:with colon"]
    read = cli(cluster, "consume", "--topic", TOPIC, "-p", "1", "-g", "cli-group", "-o", "stored", "-e")
    assert read.stdout.decode().splitlines() == [""], read.stderr.decode()


def test_bad_input_is_refused_with_a_message(cluster_factory: Callable[..., ClusterProcesses]) -> None:
    cluster = cluster_factory(1)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    for args, says in [
        (("consume", "--topic", TOPIC, "-o", "²"), "-o '²'"),
        (("consume", "--topic", TOPIC, "-o", "99999999999999999999"), "at most 2^63-1"),
        (("consume", "--topic", TOPIC, "-o", "stored", "-e"), "needs --group"),
        (("consume", "--topic", TOPIC, "-p", "5", "-e"), "partitions 0..0"),
        (("consume", "--topic", "nope", "-e"), "no topic 'nope'"),
    ]:
        done = cli(cluster, *args)
        assert done.returncode == 1 and says in done.stderr.decode() and b"Traceback" not in done.stderr, \
            (args, done.stderr.decode())
    for args, stdin, says in [
        (("produce", "--topic", TOPIC, "-K", ":"), b"no delimiter\n", "line 1: no key delimiter"),
        (("produce", "--topic", TOPIC, "--format", "json"), b'{"value": 1}\n', "line 1: value must be a string"),
        (("produce", "--topic", TOPIC, "--max-line-bytes", "4"), b"ok\ntoo long\n", "line 2 is longer"),
    ]:
        done = cli(cluster, *args, stdin=stdin)
        assert done.returncode == 1 and says in done.stderr.decode() and b"Traceback" not in done.stderr, \
            (args, done.stderr.decode())
    done = cli(cluster, "consume", "--topic", TOPIC, "-p", "²")
    assert done.returncode == 2 and b"a partition number (ASCII digits)" in done.stderr
