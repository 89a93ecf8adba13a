"""`dcmirror groups` (list, describe, reset-offsets, delete) as a subprocess against a real
broker, with a confluent-kafka consumer group whose offsets and records are known exactly.

Topic `orders`: partition 0 holds 10 records with timestamps T0 + i*1000 ms, partition 1
holds 6 records with timestamps T0 + i*2000 ms.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import REPO, BrokerProcess

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOPIC = "orders"
GROUP = "cli-group"
CLIENT_ID = "cli-test-client"
T0 = 1_700_000_000_000
COUNTS = {0: 10, 1: 6}
STEP_MS = {0: 1000, 1: 2000}


# ---------------------------------------------------------------- helpers


def wait_until(pred: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = pred()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def groups_cli(broker: BrokerProcess, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", "groups", "--bootstrap", broker.bootstrap, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout_s)


def ok(broker: BrokerProcess, *args: str) -> str:
    r = groups_cli(broker, *args)
    assert r.returncode == 0, f"{args}: exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r.stdout


def table(lines: list[str]) -> list[dict[str, str]]:
    """Rows of a whitespace-aligned table (header first) as dicts."""
    header = lines[0].split()
    rows = []
    for line in lines[1:]:
        cells = line.split()
        assert len(cells) == len(header), f"row {line!r} does not match header {header}"
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def list_groups(broker: BrokerProcess) -> dict[str, tuple[str, str]]:
    """group → (protocol type, state)."""
    lines = ok(broker, "list").splitlines()
    assert lines[0].split() == ["GROUP", "PROTOCOL-TYPE", "STATE"]
    return {r["GROUP"]: (r["PROTOCOL-TYPE"], r["STATE"]) for r in table(lines)}


def describe(broker: BrokerProcess) -> tuple[str, dict[int, dict[str, str]]]:
    """The summary line and the per-partition rows of `describe GROUP`."""
    lines = ok(broker, "describe", GROUP).splitlines()
    assert lines[1].split() == ["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                                "HOST", "CLIENT-ID"]
    rows = table(lines[1:])
    assert all(r["TOPIC"] == TOPIC for r in rows)
    return lines[0], {int(r["PARTITION"]): r for r in rows}


def offsets(broker: BrokerProcess) -> dict[int, str]:
    """CURRENT-OFFSET per partition, as `describe` shows it."""
    return {p: r["CURRENT-OFFSET"] for p, r in describe(broker)[1].items()}


def reset(broker: BrokerProcess, *args: str, execute: bool = True, topic: str = TOPIC) -> dict[int, tuple[str, str]]:
    """Run reset-offsets; returns partition → (CURRENT-OFFSET, NEW-OFFSET) from its table."""
    out = ok(broker, "reset-offsets", GROUP, "--topic", topic, *args, *(["--execute"] if execute else []))
    lines = out.splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"]
    rows = table(lines[:-1])
    if execute:
        assert lines[-1] == f"committed new offsets for group {GROUP}"
    else:
        assert lines[-1] == "dry run: nothing committed (add --execute to commit)"
    return {int(r["PARTITION"]): (r["CURRENT-OFFSET"], r["NEW-OFFSET"]) for r in rows}


def iso(ms: int, z: bool = False) -> str:
    text = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()
    return text.replace("+00:00", "Z") if z else text


def setup_topic(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "socket.timeout.ms": 10000})
    futures = admin.create_topics([NewTopic(TOPIC, num_partitions=2, replication_factor=1)],
                                  operation_timeout=10, request_timeout=15)
    futures[TOPIC].result(timeout=20)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "message.timeout.ms": 30000})
    for part, n in COUNTS.items():
        for i in range(n):
            p.produce(TOPIC, key=b"k%d" % i, value=b"p%d-%d" % (part, i), partition=part,
                      timestamp=T0 + i * STEP_MS[part])
    assert p.flush(30) == 0


def join_group(broker: BrokerProcess) -> Any:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": GROUP, "client.id": CLIENT_ID,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "socket.timeout.ms": 10000,
                  "session.timeout.ms": 30000})
    c.subscribe([TOPIC])
    deadline = time.monotonic() + 30
    while len(c.assignment()) < 2:
        assert time.monotonic() < deadline, f"assignment incomplete after 30 s: {c.assignment()}"
        c.poll(0.2)
    return c


# ---------------------------------------------------------------- the test


@pytest.mark.slow
def test_groups_cli_list_describe_reset_delete(broker_factory: Any) -> None:
    broker = broker_factory(**{"group.initial.rebalance.delay.ms": 0})
    setup_topic(broker)
    c = join_group(broker)
    closed = False
    try:
        (tp,) = c.commit(offsets=[TopicPartition(TOPIC, 0, 4)], asynchronous=False)
        assert tp.error is None
        member = c.memberid()
        assert member

        # list: the group, its protocol type and state.
        assert list_groups(broker)[GROUP] == ("consumer", "Stable")

        # describe while the consumer is up: exact offsets, lag and owner.
        summary, rows = describe(broker)
        assert summary == f"group {GROUP}: state Stable, 1 member(s)"
        assert sorted(rows) == [0, 1]
        assert rows[0] == {"TOPIC": TOPIC, "PARTITION": "0", "CURRENT-OFFSET": "4", "LOG-END-OFFSET": "10",
                           "LAG": "6", "CONSUMER-ID": member, "HOST": "/127.0.0.1", "CLIENT-ID": CLIENT_ID}
        assert rows[1] == {"TOPIC": TOPIC, "PARTITION": "1", "CURRENT-OFFSET": "-", "LOG-END-OFFSET": "6",
                           "LAG": "-", "CONSUMER-ID": member, "HOST": "/127.0.0.1", "CLIENT-ID": CLIENT_ID}

        # An active group: reset is refused (exit 1), delete fails with NON_EMPTY_GROUP.
        for execute in ([], ["--execute"]):
            r = groups_cli(broker, "reset-offsets", GROUP, "--topic", TOPIC, "--to-earliest", *execute)
            assert r.returncode == 1, (r.stdout, r.stderr)
            assert "Stable" in r.stderr and "stop its consumers" in r.stderr, r.stderr
        r = groups_cli(broker, "delete", GROUP)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "NON_EMPTY_GROUP" in r.stderr, r.stderr
        assert offsets(broker) == {0: "4", 1: "-"}
        assert list_groups(broker)[GROUP] == ("consumer", "Stable")

        c.close()
        closed = True
    finally:
        if not closed:
            c.close()

    wait_until(lambda: list_groups(broker).get(GROUP) == ("consumer", "Empty"), 30, "the group to become Empty")
    summary, rows = describe(broker)
    assert summary == f"group {GROUP}: state Empty, 0 member(s)"
    # Only partitions with a committed offset remain, now without an owner.
    assert rows == {0: {"TOPIC": TOPIC, "PARTITION": "0", "CURRENT-OFFSET": "4", "LOG-END-OFFSET": "10",
                        "LAG": "6", "CONSUMER-ID": "-", "HOST": "-", "CLIENT-ID": "-"}}

    # Dry run: a plan, nothing committed.
    assert reset(broker, "--to-earliest", execute=False) == {0: ("4", "0"), 1: ("-", "0")}
    assert offsets(broker) == {0: "4"}
    # --execute commits it.
    assert reset(broker, "--to-earliest") == {0: ("4", "0"), 1: ("-", "0")}
    assert offsets(broker) == {0: "0", 1: "0"}
    _, rows = describe(broker)
    assert [(r["CURRENT-OFFSET"], r["LOG-END-OFFSET"], r["LAG"]) for r in rows.values()] == [
        ("0", "10", "10"), ("0", "6", "6")]

    assert reset(broker, "--to-latest") == {0: ("0", "10"), 1: ("0", "6")}
    assert offsets(broker) == {0: "10", 1: "6"}
    _, rows = describe(broker)
    assert [r["LAG"] for r in rows.values()] == ["0", "0"]

    # --to-offset is clamped into [earliest, latest] per partition.
    assert reset(broker, "--to-offset", "8") == {0: ("10", "8"), 1: ("6", "6")}
    assert offsets(broker) == {0: "8", 1: "6"}
    assert reset(broker, "--to-offset", "-5", execute=False) == {0: ("8", "0"), 1: ("6", "0")}
    assert reset(broker, "--to-offset", "100", execute=False) == {0: ("8", "10"), 1: ("6", "6")}
    assert offsets(broker) == {0: "8", 1: "6"}

    # --shift-by moves from the committed offset (clamped at the ends).
    assert reset(broker, "--shift-by", "-3") == {0: ("8", "5"), 1: ("6", "3")}
    assert offsets(broker) == {0: "5", 1: "3"}
    assert reset(broker, "--shift-by", "-4") == {0: ("5", "1"), 1: ("3", "0")}
    assert reset(broker, "--shift-by", "7") == {0: ("1", "8"), 1: ("0", "6")}
    assert offsets(broker) == {0: "8", 1: "6"}

    # --to-datetime: the first record at or after the time; past every record: the log end.
    # T0+3500: partition 0 (1 s steps) → offset 4; partition 1 (2 s steps) → offset 2.
    assert reset(broker, "--to-datetime", iso(T0 + 3500)) == {0: ("8", "4"), 1: ("6", "2")}
    assert offsets(broker) == {0: "4", 1: "2"}
    # Exactly a record's timestamp selects that record; Z suffix accepted.
    assert reset(broker, "--to-datetime", iso(T0 + 6000, z=True)) == {0: ("4", "6"), 1: ("2", "3")}
    assert reset(broker, "--to-datetime", iso(T0 + 10 * 60_000)) == {0: ("6", "10"), 1: ("3", "6")}
    assert reset(broker, "--to-datetime", iso(T0 - 60_000, z=True)) == {0: ("10", "0"), 1: ("6", "0")}
    assert offsets(broker) == {0: "0", 1: "0"}

    # TOPIC:PARTITIONS limits the reset to those partitions.
    assert reset(broker, "--to-latest", topic=f"{TOPIC}:1") == {1: ("0", "6")}
    assert offsets(broker) == {0: "0", 1: "6"}

    # The committed offsets are what a consumer of the group starts from.
    c2 = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": GROUP, "enable.auto.commit": False,
                   "socket.timeout.ms": 10000})
    try:
        got = c2.committed([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)], timeout=20)
        assert [(tp.partition, tp.offset) for tp in got] == [(0, 0), (1, 6)]
    finally:
        c2.close()

    # delete: an empty group goes, and disappears from list.
    assert ok(broker, "delete", GROUP).strip() == f"deleted group {GROUP}"
    assert GROUP not in list_groups(broker)
    summary, rows = describe(broker)
    assert summary == f"group {GROUP}: state Dead, 0 member(s)"
    assert rows == {}


def test_groups_cli_errors(broker_factory: Any) -> None:
    broker = broker_factory()
    # No such group: describe shows it Dead and empty; delete fails with the Kafka error.
    lines = ok(broker, "describe", "nobody").splitlines()
    assert lines[0] == "group nobody: state Dead, 0 member(s)"
    assert len(lines) == 2
    r = groups_cli(broker, "delete", "nobody")
    assert r.returncode == 1 and "GROUP_ID_NOT_FOUND" in r.stderr, (r.stdout, r.stderr)
    # A topology cluster by name, as every other admin command takes it (issue 41: groups
    # took --bootstrap only), and neither: a clear error.
    topology = broker.data_dir.parent / "groups-topology.toml"
    topology.write_text(f'[clusters.east]\ndatacenter = "east"\nbrokers = ["{broker.bootstrap}"]\n')
    named = subprocess.run([sys.executable, "-m", "deploy.cli", "groups", "--config", str(topology), "--cluster",
                            "east", "describe", "nobody"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert named.returncode == 0 and named.stdout.startswith("group nobody: state Dead"), (named.stdout, named.stderr)
    neither = subprocess.run([sys.executable, "-m", "deploy.cli", "groups", "list"], cwd=REPO, capture_output=True,
                             text=True, timeout=60)
    assert neither.returncode == 1 and "give --bootstrap HOST:PORT or --config FILE --cluster NAME" in neither.stderr
    # An unknown topic for reset-offsets.
    r = groups_cli(broker, "reset-offsets", "nobody", "--topic", "missing", "--to-earliest")
    assert r.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in r.stderr, (r.stdout, r.stderr)
    # Nothing listens: a clear error, exit 1.
    broker.stop()
    r = groups_cli(broker, "list", timeout_s=60)
    assert r.returncode == 1 and r.stderr.startswith("dcmirror groups: "), (r.stdout, r.stderr)
