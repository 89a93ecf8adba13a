"""What TLS and SASL cost: librdkafka producing and consuming over PLAINTEXT and over
SASL_SSL (SCRAM-SHA-512) against the same broker in one run, ratios printed, nothing
asserted (`make bench`, or `pytest -m perf -q -s tests/perf -k tls`).

  DCMIRROR_BENCH_TLS_RECORDS   records per run (default 1,000,000)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.perf.benchlib import (
    PARTITIONS,
    create_topic,
    emit,
    env_int,
    kafka_consume,
    kafka_produce,
    payloads,
)
from tests.security.secured import ClientSecurity, add_users, start_secured_broker

pytestmark = pytest.mark.perf


@pytest.mark.timeout(3600)
def test_produce_and_consume_over_sasl_ssl_vs_plaintext(tmp_path: Path) -> None:
    n = env_int("DCMIRROR_BENCH_TLS_RECORDS", 1_000_000)
    values = payloads()
    broker = start_secured_broker(tmp_path)
    try:
        add_users(broker.internal, ("admin",))
        sasl = {k: v for k, v in ClientSecurity(broker, "SCRAM-SHA-512", "admin").librdkafka().items()
                if k != "bootstrap.servers"}
        rows = []
        for name, bootstrap, client in (("PLAINTEXT", broker.internal, {}),
                                        ("SASL_SSL", broker.sasl_ssl, sasl),
                                        ("PLAINTEXT (again)", broker.internal, {})):
            topic = f"bench-{name.split()[0].lower()}-{len(rows)}"
            partitions, _ = create_topic(broker.internal, topic, PARTITIONS)
            produced = kafka_produce(bootstrap, topic, n, values, **client)
            consumed = kafka_consume(bootstrap, topic, partitions, n, **client)
            rows.append((name, produced, consumed))
        base_p = (rows[0][1].msg_s + rows[2][1].msg_s) / 2
        base_c = (rows[0][2].msg_s + rows[2][2].msg_s) / 2
        lines = [f"TLS cost, {n:,} records of {len(values[0])} B, {PARTITIONS} partitions, librdkafka, one broker",
                 f"{'listener':<20}{'produce msg/s':>16}{'MB/s':>8}{'consume msg/s':>16}{'MB/s':>8}"]
        for name, p, c in rows:
            lines.append(f"{name:<20}{p.msg_s:>16,.0f}{p.mb_s:>8.1f}{c.msg_s:>16,.0f}{c.mb_s:>8.1f}")
        tls = rows[1]
        lines.append(f"SASL_SSL / PLAINTEXT (mean of the two plaintext runs): produce {tls[1].msg_s / base_p:.2f}x, "
                     f"consume {tls[2].msg_s / base_c:.2f}x (goal: TLS costs at most 30 %, i.e. >= 0.70x)")
        emit("\n".join(lines))
    finally:
        broker.proc.stop()
