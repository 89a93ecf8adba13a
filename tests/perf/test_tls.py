"""What TLS and SASL cost: librdkafka producing and consuming over PLAINTEXT and over
SASL_SSL (SCRAM-SHA-512) against the same broker in one run, ratios printed, nothing
asserted (`make bench`, or `pytest -m perf -q -s tests/perf -k tls`).

  DCMIRROR_BENCH_TLS_RECORDS   records per run (default 1,000,000)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.perf.benchlib import (
    PARTITIONS,
    RECORD_BYTES,
    create_topic,
    emit,
    env_int,
    kafka_consume,
    kafka_produce,
    payloads,
)
from tests.perf.test_mirror import _target_total
from tests.security.secured import (
    PASSWORDS,
    ClientSecurity,
    SecuredBroker,
    add_users,
    start_secured_broker,
)

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


def _mirror_rate(tmp_path: Path, name: str, source: SecuredBroker, target: SecuredBroker, n: int,
                 secured: bool) -> float:
    """One mirror worker copying n preloaded records from source to target, both sides over
    SASL_SSL (SCRAM-SHA-512) or both PLAINTEXT; msg/s from the first mirrored record on."""
    lines = []
    for cluster, b in (("source", source), ("target", target)):
        lines += [f"[clusters.{cluster}]", f'datacenter = "{cluster}"', f'brokers = ["{b.internal}"]',
                  f'data_dir = "{tmp_path / name / cluster}"']
        if secured:
            (tmp_path / "pw.properties").write_text(f"admin={PASSWORDS['admin']}\n")
            lines += [f'listeners = {{ SASL_SSL = ["{b.sasl_ssl}"] }}', 'client_listener = "SASL_SSL"',
                      "config = { \"listener.security.protocol.map\" = \"INTERNAL:PLAINTEXT,SASL_SSL:SASL_SSL\", "
                      "\"inter.broker.listener.name\" = \"INTERNAL\" }",
                      'client = { "security.protocol" = "SASL_SSL", "sasl.mechanism" = "SCRAM-SHA-512", '
                      f'"sasl.username" = "admin", "sasl.password" = "${{file:{tmp_path}/pw.properties:admin}}", '
                      f'"ssl.ca.location" = "{b.pki.ca.cert_path}" }}']
        lines.append("")
    lines += ["[defaults]", "replication_factor = 1", "", "[[mirrors]]", f'name = "{name}"', 'source = "source"',
              'target = "target"', f'topics = "{name}"', "workers = 1", 'config = { "topic.refresh.ms" = "1000" }', ""]
    topology = tmp_path / f"{name}.toml"
    topology.write_text("\n".join(lines))
    create_topic(source.internal, name, PARTITIONS)
    kafka_produce(source.internal, name, n, payloads())
    started = time.monotonic()
    worker = subprocess.Popen([sys.executable, "-m", "deploy.cli", "--log-level", "WARNING", "mirror", "--config",
                               str(topology), "--flow", name, "--worker", "0"])
    try:
        first_at = first_count = None
        while True:
            total = _target_total(target.internal, f"source.{name}")
            now = time.monotonic()
            if first_at is None and total > PARTITIONS:
                first_at, first_count = now, total
            if total >= n + PARTITIONS:
                break
            assert worker.poll() is None, "the worker died"
            assert now - started < 900, "mirror too slow"
            time.sleep(0.02)
        assert first_at is not None and first_count is not None
        return (n + PARTITIONS - first_count) / (now - first_at)
    finally:
        worker.terminate()
        worker.wait(30)


@pytest.mark.timeout(3600)
def test_mirror_worker_over_sasl_ssl_vs_plaintext(tmp_path: Path) -> None:
    """One mirror worker, source and target one broker each: both sides PLAINTEXT, both
    SASL_SSL, PLAINTEXT again; msg/s and the ratio printed (DCMIRROR_BENCH_TLS_MIRROR_RECORDS,
    default 200,000)."""
    n = env_int("DCMIRROR_BENCH_TLS_MIRROR_RECORDS", 200_000)
    source = start_secured_broker(tmp_path / "source")
    target = start_secured_broker(tmp_path / "target")
    try:
        for b in (source, target):
            add_users(b.internal, ("admin",))
        rows = [(label, _mirror_rate(tmp_path, f"ev{i}", source, target, n, secured))
                for i, (label, secured) in enumerate((("PLAINTEXT", False), ("SASL_SSL", True),
                                                      ("PLAINTEXT (again)", False)))]
        base = (rows[0][1] + rows[2][1]) / 2
        lines = [f"MIRROR over TLS: one worker, {n:,} records of {RECORD_BYTES} B, {PARTITIONS} partitions, "
                 "source and target one broker each"]
        lines += [f"{label:<20}{rate:>14,.0f} msg/s" for label, rate in rows]
        lines.append(f"SASL_SSL / PLAINTEXT (mean of the two plaintext runs): {rows[1][1] / base:.2f}x")
        emit("\n".join(lines))
    finally:
        source.proc.stop()
        target.proc.stop()
