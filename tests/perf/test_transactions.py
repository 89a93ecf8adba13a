"""What transactions cost: librdkafka producing with a transactional id (a commit every
100 ms) against idempotent produce of the same records, and read_committed against
read_uncommitted consumers of that transactional topic, in one run on one broker; rates and
ratios printed, only record counts asserted (`make bench`, or
`pytest -m perf -q -s tests/perf -k transactions`).

  DCMIRROR_BENCH_TXN_RECORDS   records per run (default 2,000,000: a few seconds each, ~20 commits)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.harness import BrokerProcess
from tests.perf.benchlib import (
    PARTITIONS,
    Rate,
    create_topic,
    emit,
    env_int,
    kafka_consume,
    kafka_produce,
    payloads,
    producer_conf,
)

pytestmark = pytest.mark.perf

COMMIT_INTERVAL_S = 0.1


def transactional_produce(bootstrap: str, topic: str, n: int, values: list[bytes]) -> tuple[Rate, int]:
    """n records in transactions committed every COMMIT_INTERVAL_S (as Kafka Streams' and
    Flink's defaults do, roughly); the rate and the number of commits."""
    p = Producer(producer_conf(bootstrap, **{"transactional.id": f"bench-{topic}", "enable.idempotence": True,
                                             "acks": "all", "delivery.report.only.error": True}))
    p.init_transactions(60)
    started = time.monotonic()
    commits = 0
    sent = 0
    while sent < n:
        p.begin_transaction()
        deadline = time.monotonic() + COMMIT_INTERVAL_S
        while sent < n and time.monotonic() < deadline:
            for _ in range(1000):
                if sent >= n:
                    break
                try:
                    p.produce(topic, value=values[sent & (len(values) - 1)], partition=sent % PARTITIONS)
                except BufferError:
                    p.poll(0.01)
                    continue
                sent += 1
            p.poll(0)
        p.commit_transaction(120)
        commits += 1
    elapsed = time.monotonic() - started
    return Rate(n, n * len(values[0]), elapsed), commits


@pytest.mark.timeout(3600)
def test_transactional_vs_idempotent_produce_and_committed_vs_uncommitted_reads(tmp_path: Path) -> None:
    n = env_int("DCMIRROR_BENCH_TXN_RECORDS", 2_000_000)
    values = payloads()
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        rows = []
        for name in ("idempotent", "transactional", "idempotent (again)"):
            topic = f"bench-{name.split()[0]}-{len(rows)}"
            partitions, _ = create_topic(broker.bootstrap, topic, PARTITIONS)
            if name.startswith("transactional"):
                rate, commits = transactional_produce(broker.bootstrap, topic, n, values)
            else:
                rate, commits = kafka_produce(broker.bootstrap, topic, n, values, **{
                    "enable.idempotence": True, "acks": "all"}), 0
            rows.append((name, topic, partitions, rate, commits))
        txn_topic, partitions = rows[1][1], rows[1][2]
        # Both readers of the transactional topic, twice, alternating.
        reads: dict[str, list[Rate]] = {"read_uncommitted": [], "read_committed": []}
        for isolation in ("read_uncommitted", "read_committed") * 2:
            reads[isolation].append(kafka_consume(broker.bootstrap, txn_topic, partitions, n,
                                                  **{"isolation.level": isolation}))
            assert reads[isolation][-1].records == n, f"{isolation}: {reads[isolation][-1].records} of {n} read"
    finally:
        broker.stop()
    base = (rows[0][3].msg_s + rows[2][3].msg_s) / 2
    txn = rows[1][3]
    lines = [f"Transactions, {n:,} records of {len(values[0])} B, {PARTITIONS} partitions, librdkafka, one broker",
             f"{'produce':<28}{'msg/s':>12}{'MB/s':>8}{'commits':>9}"]
    for name, _, _, rate, commits in rows:
        lines.append(f"{name:<28}{rate.msg_s:>12,.0f}{rate.mb_s:>8.1f}{commits:>9}")
    lines.append(f"transactional (commit every {COMMIT_INTERVAL_S * 1000:.0f} ms) / idempotent (mean of two): "
                 f"{txn.msg_s / base:.2f}x")
    best = {k: max(r.msg_s for r in v) for k, v in reads.items()}
    for isolation, rates in reads.items():
        lines.append(f"consume {isolation:<20}" + "  ".join(f"{r.msg_s:>10,.0f} msg/s" for r in rates))
    lines.append(f"read_committed / read_uncommitted (best of two each): "
                 f"{best['read_committed'] / best['read_uncommitted']:.2f}x")
    emit("\n".join(lines))
