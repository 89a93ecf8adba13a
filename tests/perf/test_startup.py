"""dcmirror restart time with ~1 GiB on disk: after a clean SIGTERM and after kill -9 (recovery).

Run with `make bench` (or `pytest -m perf -q -s tests/perf -k startup`). Knobs:

  DCMIRROR_BENCH_RECOVERY_BYTES         payload bytes written before restarting (default 1 GiB)
  DCMIRROR_BENCH_RECOVERY_RECORD_BYTES  record size for that load (default 1024)
  DCMIRROR_BENCH_RECOVERY_SEGMENT_BYTES topic segment.bytes (default 64 MiB)

"listening" = the harness' TCP connect succeeds (polled every 50 ms); "serving" = a fresh
client got ListOffsets answers for every partition equal to the high watermarks before the
restart. The page cache is warm (the data was just written), so this is not a cold-disk figure.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from tests.harness import BrokerProcess
from tests.perf.benchlib import (
    PARTITIONS,
    consumer_conf,
    create_topic,
    dir_bytes,
    emit,
    env_int,
    kafka_produce,
    measure,
    payloads,
    progress,
    tail,
)

pytestmark = pytest.mark.perf

TOPIC = "bench-recovery"


def high_watermarks(bootstrap: str, partitions: int, timeout_s: float = 10.0) -> dict[int, int]:
    c = Consumer(consumer_conf(bootstrap, **{"socket.connection.setup.timeout.ms": 5000}))
    try:
        return {p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=timeout_s, cached=False)[1]
                for p in range(partitions)}
    finally:
        c.close()


def restart_timed(broker: BrokerProcess, partitions: int, expected: dict[int, int],
                  timeout_s: float = 1800.0) -> tuple[float, float | None, str, str]:
    """start(); returns (s to listening, s to serving expected watermarks or None, note, new log)."""
    log_before = len(broker.log_text())
    t0 = time.perf_counter()
    broker.start(timeout_s=timeout_s)
    listening = time.perf_counter() - t0
    serving: float | None = None
    note = ""
    last: object = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            last = high_watermarks(broker.bootstrap, partitions, timeout_s=5)
            if last == expected:
                serving = time.perf_counter() - t0
                break
        except KafkaException as exc:
            last = exc
        time.sleep(0.05)
    if serving is None:
        note = f"high watermarks never matched within 120s; last answer {last!r}, expected {expected}"
    return listening, serving, note, broker.log_text()[log_before:]


def reported_startup(log: str) -> str:
    """The broker's own 'startup took X s' (process start to listening, minus interpreter start)."""
    found = re.findall(r"startup took ([\d.]+ ?s)", log)
    return f", broker-reported startup {found[-1]}" if found else ""


def segment_files(data_dir: Path) -> int:
    return sum(1 for f in data_dir.glob(f"{TOPIC}-*/*.log") if f.is_file())


@pytest.mark.timeout(4 * 3600)
def test_startup_and_recovery(tmp_path: Path) -> None:
    total = env_int("DCMIRROR_BENCH_RECOVERY_BYTES", 1 << 30)
    record = env_int("DCMIRROR_BENCH_RECOVERY_RECORD_BYTES", 1024)
    segment = env_int("DCMIRROR_BENCH_RECOVERY_SEGMENT_BYTES", 64 << 20)
    n = max(1, total // record)
    values = payloads(record)
    lines = [f"STARTUP / RECOVERY  {n:,} x {record} B = {n * record / 2**20:,.0f} MiB payload, "
             f"{PARTITIONS} partitions, segment.bytes={segment:,}"]
    failures: list[str] = []
    print(f"\n=== startup/recovery with {n * record / 2**20:,.0f} MiB ===", flush=True)

    broker = BrokerProcess(tmp_path / "broker")
    try:
        broker.start()
        assert broker.proc is not None
        partitions, note = create_topic(broker.bootstrap, TOPIC, PARTITIONS,
                                        config={"segment.bytes": str(segment)})
        if note:
            lines.append(f"topic: {note}")
        progress(f"loading {n:,} records into {broker.bootstrap}")
        load = measure({"broker": broker.proc.pid}, kafka_produce, broker.bootstrap, TOPIC, n, values)
        lines.append(f"load: {load.describe()}")
        progress(f"load: {load.describe()}")
        expected = high_watermarks(broker.bootstrap, partitions)
        if sum(expected.values()) != n + 1:
            lines.append(f"note: high watermarks sum to {sum(expected.values()):,}, expected {n + 1:,}")
        lines.append(f"on disk: {dir_bytes(broker.data_dir) / 2**20:,.0f} MiB in "
                     f"{segment_files(broker.data_dir)} {TOPIC} segment files")

        t0 = time.perf_counter()
        rc = broker.stop(timeout_s=300)
        lines.append(f"clean shutdown (SIGTERM -> exit {rc}): {time.perf_counter() - t0:.2f}s")

        listening, serving, note, log = restart_timed(broker, partitions, expected)
        lines.append(f"restart after clean shutdown: listening {listening:.2f}s, serving "
                     f"{f'{serving:.2f}s' if serving is not None else 'NEVER'}{reported_startup(log)} "
                     f"{note}".rstrip())
        lines.append("  broker log of that start:\n    " + tail(log, 12).replace("\n", "\n    "))
        progress(lines[-2])
        if note:
            failures.append(f"after clean restart: {note}")

        broker.kill9()
        listening, serving, note, log = restart_timed(broker, partitions, expected)
        lines.append(f"restart after kill -9 (recovery): listening {listening:.2f}s, serving "
                     f"{f'{serving:.2f}s' if serving is not None else 'NEVER'}{reported_startup(log)} "
                     f"{note}".rstrip())
        lines.append("  broker log of that start:\n    " + tail(log, 12).replace("\n", "\n    "))
        progress(lines[-2])
        if note:
            failures.append(f"after kill -9: {note}")
    except Exception as exc:  # noqa: BLE001 - reported with the broker log
        failures.append(f"{exc!r}\n--- broker log tail ---\n{tail(broker.log_text(), 40)}")
    finally:
        try:
            broker.stop(timeout_s=300)
        except Exception as exc:  # noqa: BLE001
            failures.append(f"broker did not stop on SIGTERM: {exc!r}")
        shutil.rmtree(broker.data_dir, ignore_errors=True)

    if failures:
        lines += ["", "FAILURES:", *failures]
    emit("\n".join(lines))
    if failures:
        pytest.fail("startup benchmark could not complete:\n" + "\n\n".join(failures), pytrace=False)
