"""Share groups (KIP-932) on dcmirror beside Apache Kafka (the pinned peer, `make peers`): one
broker each, the same broker settings (test_vs_kafka.BENCH_BROKER_CONFIG), systems alternated
round by round, medians, the per-round ratios' range and the load average beside.

A topic of 8 partitions holds 200,000 records of 200 bytes (written before the group starts;
the group's `share.auto.offset.reset=earliest`); 4 share-consumer processes (librdkafka's
share consumer, confluent-kafka's ShareConsumer, implicit acknowledgement: each poll accepts
the poll before's records, a last commitSync the rest; tests/perf/share_bench_member.py) start
together. Figures:
- records/s accepted: the records over the time from the first record delivered to the last
  member's final commitSync answered (the stop is seen within 0.1 s of the last record);
- the first record: seconds from the first member's subscribe() to the first record delivered
  to any member (joining, assignment, the share partitions' start).
Every record must be delivered (exactly the records written; a second delivery is counted).

`pytest -m perf -q -s tests/perf/test_share_groups_vs_kafka.py`; knobs
DCMIRROR_BENCH_SHARE_RECORDS (200,000) and DCMIRROR_BENCH_SHARE_ROUNDS (3).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from tests.harness import REPO
from tests.peers.kafka import KAFKA_VERSION
from tests.perf.benchlib import Alternated, emit, env_int, kafka_produce, payloads, progress
from tests.perf.test_vs_kafka import BENCH_BROKER_CONFIG, SYSTEMS, make_topic

pytestmark = pytest.mark.perf

TOPIC, PARTITIONS, MEMBERS = "share-bench", 8, 4
PROGRESS_S = 120.0  # the longest the members may go without a new record


def earliest(bootstrap: str, group: str) -> None:
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(60)


class Lines:
    """A member process's stdout read as JSON lines, whatever has arrived (no buffered lag)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc, self.fd, self.buffer = proc, proc.stdout.fileno(), b""

    def read(self) -> list[dict[str, Any]]:
        chunk = os.read(self.fd, 1 << 20)
        assert chunk, f"a member exited: {self.proc.wait(10)}"
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines]

    def until(self, key: str) -> dict[str, Any]:
        while True:
            for line in self.read():
                if key in line:
                    return line


def share_consume(bootstrap: str, group: str, expected: int) -> dict[str, float]:
    """4 member processes read the topic until `expected` records were delivered to them."""
    procs = [subprocess.Popen([sys.executable, "-m", "tests.perf.share_bench_member", bootstrap, group, TOPIC],
                              cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(MEMBERS)]
    members = [Lines(p) for p in procs]
    try:
        subscribed = [m.until("subscribed")["subscribed"] for m in members]
        counts = [0] * MEMBERS
        first: list[float] = []
        last_change = time.monotonic()
        while sum(counts) < expected:
            ready, _, _ = select.select([m.fd for m in members], [], [], 1.0)
            for i, m in enumerate(members):
                if m.fd not in ready:
                    continue
                for line in m.read():
                    if "first" in line:
                        first.append(line["first"])
                    elif line["count"] != counts[i]:
                        counts[i], last_change = line["count"], time.monotonic()
            assert time.monotonic() - last_change < PROGRESS_S, f"{sum(counts)} of {expected} delivered"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"stop\n")
            p.stdin.flush()
        done: list[float] = []
        records: Counter[tuple[int, int]] = Counter()
        for p, m in zip(procs, members, strict=True):
            line = m.until("done")
            done.append(line["done"])
            records.update(tuple(r) for r in line["records"])
            p.wait(30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert len(records) == expected, f"{len(records)} distinct records of {expected}"
    return {"rate": expected / (max(done) - min(first)), "first_s": min(first) - min(subscribed),
            "twice": float(sum(n - 1 for n in records.values())),
            "spread": float(max(counts) - min(counts))}


@pytest.mark.timeout(3600)
def test_four_share_consumers_beside_kafka(tmp_path: Path) -> None:
    n = env_int("DCMIRROR_BENCH_SHARE_RECORDS", 200_000)
    rounds = env_int("DCMIRROR_BENCH_SHARE_ROUNDS", 3)
    values = payloads()
    figures = Alternated()
    notes: list[str] = []
    for round_no in range(rounds):
        order = SYSTEMS if round_no % 2 == 0 else SYSTEMS[::-1]
        for name, start in order:
            progress(f"round {round_no + 1}/{rounds}, {name}")
            with start(tmp_path / f"{name}-{round_no}", 1) as system:
                make_topic(system.bootstrap, TOPIC, PARTITIONS)
                kafka_produce(system.bootstrap, TOPIC, n, values)  # and one warm-up record first
                group = f"share-bench-{round_no}"
                earliest(system.bootstrap, group)
                got = share_consume(system.bootstrap, group, n + 1)
                figures.add("rate", name, got["rate"])
                figures.add("first_s", name, got["first_s"])
                notes.append(f"round {round_no + 1} {name}: {got['rate']:,.0f} records/s, first record after "
                             f"{got['first_s']:.2f} s, {got['twice']:.0f} delivered twice, members' counts differ "
                             f"by {got['spread']:.0f}")
    emit("\n".join([
        f"=== share groups beside Apache Kafka {KAFKA_VERSION}: {MEMBERS} share consumers (librdkafka "
        f"ShareConsumer processes, implicit acknowledgement), {n:,} x 200-byte records in {PARTITIONS} partitions, "
        f"one broker, {rounds} alternated rounds ===",
        "the same broker settings on both sides: " + ", ".join(f"{k}={v}" for k, v in BENCH_BROKER_CONFIG.items()),
        figures.render("share group", [
            ("rate", "records accepted by 4 share consumers (/s)", "/s"),
            ("first_s", "group start to first record delivered (s)", "s"),
        ], ("dcmirror", f"Kafka {KAFKA_VERSION}")),
        "ratio: dcmirror / Kafka per round (for the first record lower is better); load: 1-minute load average",
        *notes]))
