"""dcmirror vs Redis Streams: bulk produce/consume throughput and paced produce latency.

Run with `make bench` (or `pytest -m perf -q -s tests/perf -k throughput`). Figures are printed
and written to tests/perf/results/latest.txt; nothing is asserted about speed. Knobs:

  DCMIRROR_BENCH_RECORDS         records per system in the throughput run (default 2,000,000)
  DCMIRROR_BENCH_REDIS_PIPELINE  XADDs per redis-py pipeline (default 2000)
  DCMIRROR_BENCH_KCAT            0 to skip the kcat consumer figure (default 1)
  DCMIRROR_BENCH_LATENCY_RATE    paced produce rate, msg/s (default 20000)
  DCMIRROR_BENCH_LATENCY_SECONDS paced produce duration (default 10)

The broker and redis-server never run at the same time (the reference machine has 2 cores).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.harness import BrokerProcess
from tests.perf.benchlib import (
    PARTITIONS,
    Latency,
    OtherLoad,
    Rate,
    RedisServer,
    create_topic,
    dir_bytes,
    emit,
    env_float,
    env_int,
    kafka_consume,
    kafka_paced_latency,
    kafka_produce,
    kcat_consume,
    measure,
    payloads,
    progress,
    redis_benchmark_produce,
    redis_consume,
    redis_paced_latency,
    redis_produce,
    tail,
)

pytestmark = pytest.mark.perf

PRODUCE_TARGET = 2.0  # dcmirror/redis msg/s, from the issue
CONSUME_TARGET = 3.0


def _fmt_rate(rate: Rate | None, failed: str = "FAILED") -> tuple[str, str]:
    if rate is None:
        return failed, ""
    return f"{rate.msg_s:,.0f}", f"{rate.mb_s:.1f}"


def _ratio(a: Rate | None, b: Rate | None) -> float | None:
    if a is None or b is None or not b.msg_s:
        return None
    return a.msg_s / b.msg_s


def _verdict(ratio: float | None, target: float) -> str:
    if ratio is None:
        return "n/a (missing figure)"
    return f"{ratio:.2f}x -> {'MET' if ratio >= target else 'NOT MET'} (target >= {target:g}x)"


@pytest.mark.timeout(4 * 3600)
def test_throughput_vs_redis(tmp_path: Path) -> None:
    n = env_int("DCMIRROR_BENCH_RECORDS", 2_000_000)
    pipeline_size = env_int("DCMIRROR_BENCH_REDIS_PIPELINE", 2000)
    use_kcat = env_int("DCMIRROR_BENCH_KCAT", 1) and shutil.which("kcat")
    values = payloads()
    topic = "bench-throughput"
    failures: list[str] = []
    details: list[str] = []

    print(f"\n=== throughput: {n:,} x {len(values[0])}-byte records, {PARTITIONS} partitions ===", flush=True)

    # ---------------------------------------------------------------- dcmirror
    dc_prod: Rate | None = None
    dc_cons: Rate | None = None
    dc_kcat: Rate | None = None
    broker = BrokerProcess(tmp_path / "broker")
    try:
        broker.start()
        assert broker.proc is not None
        pids = {"broker": broker.proc.pid}
        partitions, note = create_topic(broker.bootstrap, topic, PARTITIONS)
        if note:
            details.append(f"dcmirror topic: {note}")
        progress(f"dcmirror on {broker.bootstrap}: producing {n:,} records")
        dc_prod = measure(pids, kafka_produce, broker.bootstrap, topic, n, values)
        progress(f"dcmirror produce: {dc_prod.describe()}")
        details.append(f"dcmirror produce:  {dc_prod.describe()}")
        details.append(f"dcmirror data dir after produce: {dir_bytes(broker.data_dir) / 2**20:,.0f} MiB "
                       f"for {n * len(values[0]) / 2**20:,.0f} MiB of payload")
        expected = n + 1  # + the warm-up record
        dc_cons = measure(pids, kafka_consume, broker.bootstrap, topic, partitions, expected)
        progress(f"dcmirror consume: {dc_cons.describe()}")
        details.append(f"dcmirror consume:  {dc_cons.describe()}")
        if use_kcat:
            try:
                dc_kcat = measure(pids, kcat_consume, broker.bootstrap, topic, expected)
                progress(f"dcmirror kcat consume: {dc_kcat.describe()}")
                details.append(f"dcmirror kcat:     {dc_kcat.describe()}")
            except Exception as exc:  # noqa: BLE001 - reported with the broker log
                failures.append(f"dcmirror kcat consume: {exc!r}\n--- broker log tail ---\n"
                                f"{tail(broker.log_text(), 40)}")
    except Exception as exc:  # noqa: BLE001 - still measure Redis, then fail with details
        failures.append(f"dcmirror: {exc!r}\n--- broker log tail ---\n{tail(broker.log_text(), 40)}")
    finally:
        try:
            rc = broker.stop()
            if rc not in (0, None) and not failures:
                details.append(f"note: broker exited {rc} on SIGTERM")
        except Exception as exc:  # noqa: BLE001
            failures.append(f"dcmirror: broker did not stop on SIGTERM: {exc!r}")
    shutil.rmtree(broker.data_dir, ignore_errors=True)

    # ---------------------------------------------------------------- Redis Streams
    r_prod: Rate | None = None
    r_cons: Rate | None = None
    r_bench: Rate | None = None
    stream = b"bench"
    with RedisServer(tmp_path / "redis") as server:
        pids = {"redis": server.pid}
        r = server.client()
        progress(f"redis on 127.0.0.1:{server.port}: XADDing {n:,} entries")
        try:
            r_prod = measure(pids, redis_produce, r, stream, n, values, pipeline_size)
            progress(f"redis produce: {r_prod.describe()}")
            details.append(f"redis produce:     {r_prod.describe()}")
            r_cons = measure(pids, redis_consume, r, stream, n)
            progress(f"redis consume: {r_cons.describe()}")
            details.append(f"redis consume:     {r_cons.describe()}")
            info = r.info("persistence")
            details.append(f"redis after produce: AOF {info.get('aof_current_size', 0) / 2**20:,.0f} MiB, "
                           f"{info.get('aof_rewrites', '?')} AOF rewrite(s) during the run, "
                           f"rewrite in progress: {info.get('aof_rewrite_in_progress', '?')}, "
                           f"used memory {r.info('memory').get('used_memory', 0) / 2**20:,.0f} MiB")
            r.delete(stream)
            r_bench = measure(pids, redis_benchmark_produce, server.port, "bench-native", n)
            if r_bench is not None:
                progress(f"redis-benchmark produce: {r_bench.describe()}")
                details.append(f"redis-benchmark:   {r_bench.describe()}")
        except Exception as exc:  # noqa: BLE001
            failures.append(f"redis: {exc!r}\n--- redis log tail ---\n{tail(server.log_text(), 20)}")
        finally:
            r.close()
    shutil.rmtree(tmp_path / "redis", ignore_errors=True)

    # ---------------------------------------------------------------- report
    rows = [
        ("dcmirror (confluent_kafka producer/consumer)", dc_prod, dc_cons),
        ("dcmirror (consume: kcat -C -e, no Python)", None, dc_kcat),
        (f"redis Streams (redis-py, XADD pipeline {pipeline_size}, XREAD 10000)", r_prod, r_cons),
        ("redis Streams (redis-benchmark XADD -P 1000, C)", r_bench, None),
    ]
    lines = [f"THROUGHPUT  {n:,} records x {len(values[0])} B, dcmirror topic {PARTITIONS} partitions, "
             "acks=1 linger.ms=5 batch.size=1MiB; redis appendonly everysec",
             f"{'system':<66} {'produce msg/s':>14} {'MB/s':>7} {'consume msg/s':>14} {'MB/s':>7}"]
    for label, prod, cons in rows:
        if label.startswith("dcmirror (consume") and not use_kcat:
            continue
        if label.startswith("redis Streams (redis-benchmark") and r_bench is None:
            continue
        p_msgs, p_mb = _fmt_rate(prod, "FAILED" if label.startswith("dcmirror (conf") or
                                 label.startswith("redis Streams (redis-py") else "-")
        c_msgs, c_mb = _fmt_rate(cons, "-" if label.startswith("redis Streams (redis-bench") else "FAILED")
        lines.append(f"{label:<66} {p_msgs:>14} {p_mb:>7} {c_msgs:>14} {c_mb:>7}")
    produce_ratio = _ratio(dc_prod, r_prod)
    consume_ratio = _ratio(dc_cons, r_cons)
    kcat_ratio = _ratio(dc_kcat, r_cons)
    lines.append(f"{'ratio dcmirror/redis (Python clients on both sides)':<66} "
                 f"{(f'{produce_ratio:.2f}x' if produce_ratio else 'n/a'):>14} {'':>7} "
                 f"{(f'{consume_ratio:.2f}x' if consume_ratio else 'n/a'):>14}")
    if use_kcat:
        lines.append(f"{'ratio dcmirror kcat / redis-py XREAD':<66} {'':>14} {'':>7} "
                     f"{(f'{kcat_ratio:.2f}x' if kcat_ratio else 'n/a'):>14}")
    if r_bench is not None and dc_prod is not None:
        lines.append(f"{'ratio dcmirror / redis-benchmark (native client)':<66} "
                     f"{(f'{_ratio(dc_prod, r_bench) or 0:.2f}x'):>14}")
    lines.append(f"target produce >= {PRODUCE_TARGET:g}x redis msg/s: {_verdict(produce_ratio, PRODUCE_TARGET)}")
    lines.append(f"target consume >= {CONSUME_TARGET:g}x redis msg/s: {_verdict(consume_ratio, CONSUME_TARGET)}"
                 + (f"; with kcat: {_verdict(kcat_ratio, CONSUME_TARGET)}" if use_kcat else ""))
    lines.append("")
    lines.extend(details)
    if failures:
        lines.append("")
        lines.append("FAILURES:")
        lines.extend(failures)
    emit("\n".join(lines))
    if failures:
        pytest.fail("benchmark could not complete:\n" + "\n\n".join(failures), pytrace=False)


@pytest.mark.timeout(1800)
def test_produce_latency_fixed_rate(tmp_path: Path) -> None:
    rate = env_float("DCMIRROR_BENCH_LATENCY_RATE", 20_000)
    seconds = env_float("DCMIRROR_BENCH_LATENCY_SECONDS", 10)
    values = payloads()
    results: list[Latency] = []
    failures: list[str] = []
    print(f"\n=== paced produce latency: {rate:,.0f} msg/s for {seconds:g}s ===", flush=True)

    broker = BrokerProcess(tmp_path / "broker")
    try:
        broker.start()
        partitions, note = create_topic(broker.bootstrap, "bench-latency", PARTITIONS)
        with OtherLoad(broker.proc.pid if broker.proc else None) as load:
            res = kafka_paced_latency(broker.bootstrap, "bench-latency", rate, seconds, values)
        res.note = "; ".join(x for x in (res.note, note, load.describe()) if x)
        results.append(res)
        progress(res.row())
    except Exception as exc:  # noqa: BLE001
        failures.append(f"dcmirror: {exc!r}\n--- broker log tail ---\n{tail(broker.log_text(), 40)}")
    finally:
        try:
            broker.stop()
        except Exception as exc:  # noqa: BLE001
            failures.append(f"dcmirror: broker did not stop on SIGTERM: {exc!r}")
    shutil.rmtree(broker.data_dir, ignore_errors=True)

    with RedisServer(tmp_path / "redis") as server:
        r = server.client()
        try:
            with OtherLoad(server.pid) as load:
                res = redis_paced_latency(r, b"bench-latency", rate, seconds, values)
            res.note = load.describe()
            results.append(res)
            progress(res.row())
        except Exception as exc:  # noqa: BLE001
            failures.append(f"redis: {exc!r}")
        finally:
            r.close()
    shutil.rmtree(tmp_path / "redis", ignore_errors=True)

    lines = [f"PRODUCE LATENCY  paced {rate:,.0f} msg/s for {seconds:g}s, {len(values[0])} B records "
             "(dcmirror: produce() -> delivery callback, acks=1 linger.ms=5; "
             "redis: enqueue into pipeline -> reply)",
             Latency.header()]
    lines += [res.row() for res in results]
    lines += [f"note {res.system}: {res.note}" for res in results if res.note]
    if failures:
        lines += ["", "FAILURES:", *failures]
    emit("\n".join(lines))
    if failures:
        pytest.fail("latency benchmark could not complete:\n" + "\n\n".join(failures), pytrace=False)
