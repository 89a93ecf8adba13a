"""What KIP-848 changes for a consumer group: librdkafka consumers with the classic protocol
(`group.protocol=classic`, eager `range`, Kafka's defaults) beside the same consumers with
`group.protocol=consumer` (server-side `uniform`), in one run on one broker. Measured, not
asserted (only that every phase completes):

- settle: 3 consumers subscribe; seconds until they own 2 of the 6 partitions each;
- join: a 4th consumer joins; seconds until it owns partitions, and the partition-seconds
  the others spent without partitions they had before (eager: everyone stops);
- leave: one closes; seconds until the 3 others own all 6 again.

`pytest -m perf -q -s tests/perf -k group_protocols`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness import BrokerProcess
from tests.perf.benchlib import create_topic, emit

pytestmark = pytest.mark.perf

PARTITIONS = 6
CLASSIC = {"group.protocol": "classic", "session.timeout.ms": 10_000, "heartbeat.interval.ms": 1_000,
           "partition.assignment.strategy": "range"}
CONSUMER = {"group.protocol": "consumer"}


class Member:
    """One consumer in a thread; `owned` follows its assignment callbacks, and the time
    it spent owning fewer partitions than before a change is added up."""

    def __init__(self, bootstrap: str, topic: str, group: str, name: str, conf: dict[str, Any]) -> None:
        self.bootstrap, self.topic, self.group, self.name, self.conf = bootstrap, topic, group, name, conf
        self.owned: set[int] = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.lost_since: float | None = None
        self.lost_s = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from confluent_kafka import Consumer

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group, "client.id": self.name,
                      "enable.auto.commit": False, "auto.offset.reset": "earliest", **self.conf})
        incremental = self.conf["group.protocol"] == "consumer"

        def on_assign(_c: Any, parts: list[Any]) -> None:
            with self.lock:
                new = {p.partition for p in parts}
                self.owned = self.owned | new if incremental else new
                if self.lost_since is not None:
                    self.lost_s += time.monotonic() - self.lost_since
                    self.lost_since = None

        def on_revoke(_c: Any, parts: list[Any]) -> None:
            with self.lock:
                gone = {p.partition for p in parts}
                kept = self.owned - gone
                if self.owned and not self.stop.is_set() and (not incremental or not kept):
                    self.lost_since = time.monotonic()  # stopped consuming what it had
                self.owned = kept

        c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
        while not self.stop.is_set():
            c.poll(0.1)
        c.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)

    def count(self) -> int:
        with self.lock:
            return len(self.owned)


def wait(pred: Any, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if pred():
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"{what} not within {timeout_s} s")


def measure(bootstrap: str, protocol: str, conf: dict[str, Any]) -> dict[str, float]:
    topic, group = f"gp-{protocol}", f"gp-{protocol}-group"
    create_topic(bootstrap, topic, PARTITIONS)
    members = [Member(bootstrap, topic, group, f"{protocol}-{i}", conf) for i in range(3)]
    out: dict[str, float] = {}
    try:
        out["settle_s"] = wait(lambda: sorted(m.count() for m in members) == [2, 2, 2], 120, "3 settled")
        time.sleep(2.0)
        fourth = Member(bootstrap, topic, group, f"{protocol}-3", conf)
        members.append(fourth)
        out["join_s"] = wait(lambda: fourth.count() > 0 and sum(m.count() for m in members) == PARTITIONS
                             and all(m.count() for m in members), 120, "4th member in")
        time.sleep(1.0)
        out["join_stopped_member_s"] = sum(m.lost_s for m in members[:3])
        leaving = members.pop(0)
        started = time.monotonic()
        leaving.close()
        wait(lambda: sum(m.count() for m in members) == PARTITIONS and all(m.count() for m in members), 120,
             "3 own all again")
        out["leave_s"] = time.monotonic() - started  # from the close (LeaveGroup / epoch -1) on
    finally:
        for m in members:
            m.close()
    return out


def test_classic_vs_consumer_rebalance(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "broker", **{"group.consumer.heartbeat.interval.ms": 1000}).start()
    try:
        classic = measure(broker.bootstrap, "classic", CLASSIC)
        kip848 = measure(broker.bootstrap, "consumer", CONSUMER)
    finally:
        broker.stop()
    lines = ["consumer group rebalances, librdkafka, 6 partitions (classic eager range vs KIP-848 uniform)"]
    for key in ("settle_s", "join_s", "join_stopped_member_s", "leave_s"):
        ratio = kip848[key] / classic[key] if classic[key] else float("nan")
        lines.append(f"  {key:<24} classic {classic[key]:7.2f}   consumer {kip848[key]:7.2f}   ratio {ratio:5.2f}")
    emit("\n".join(lines))
