"""Our trio client vs confluent_kafka (librdkafka) against one dcmirror broker: bulk produce
and consume of the same records, with Redis Streams (redis-py) as the standing peer.

Run with `make bench` (or `pytest -m perf -q -s tests/perf -k client`). Figures are printed
and written to tests/perf/results/latest.txt; nothing is asserted about speed. Knobs:

  DCMIRROR_BENCH_CLIENT_RECORDS  records per produce/consume run (default 500,000)
  DCMIRROR_BENCH_CLIENT_ROUNDS   runs per client and phase, alternating clients (default 2)
  DCMIRROR_BENCH_CLIENT_REDIS    0 to skip the Redis Streams line (default 1)

Both producers: acks=all, enable.idempotence=true, linger.ms=5, uncompressed (plus one lz4 and
one zstd run of ours on half the records; the payloads are random, so that prices the codec,
not a saving). Every produce run writes a fresh topic; both consumers read the topic of the
first librdkafka produce run. The broker and redis-server never run at the same time.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from cluster.client.accumulator import BufferFull
from cluster.client.consumer import Consumer
from cluster.client.producer import Producer
from tests.harness import BrokerProcess
from tests.perf.benchlib import (
    PARTITIONS,
    Rate,
    RedisServer,
    create_topic,
    emit,
    env_int,
    kafka_consume,
    kafka_produce,
    measure,
    payloads,
    progress,
    redis_consume,
    redis_produce,
    tail,
)

pytestmark = pytest.mark.perf

TARGET = 0.5  # ours/librdkafka msg/s, from the issue
LINGER_MS = 5
CHECKPOINT_EVERY = 1024  # records between checkpoints of the produce loop (lets the sender run)
REDIS_PIPELINE = 2000


# --------------------------------------------------------------------------- librdkafka side


def rdkafka_produce(bootstrap: str, topic: str, n: int, values: Sequence[bytes]) -> Rate:
    """benchlib.kafka_produce with acks=all and idempotence, like our producer's defaults."""
    rate = kafka_produce(bootstrap, topic, n, values,
                         **{"acks": "all", "enable.idempotence": True, "linger.ms": LINGER_MS})
    rate.note = "; ".join(x for x in ("+1 warm-up record before the clock", rate.note) if x)
    return rate


# --------------------------------------------------------------------------- our client


def ours_produce(bootstrap: str, topic: str, n: int, values: Sequence[bytes], **client: object) -> Rate:
    """produce() n records in a tight loop (send() when buffer.memory is full), then flush().

    A warm-up record is acknowledged before the clock starts (connection, metadata and the
    producer id), as kafka_produce does. The clock stops when flush() returns.
    """
    return trio.run(_ours_produce, bootstrap, topic, n, values, client)


async def _ours_produce(bootstrap: str, topic: str, n: int, values: Sequence[bytes],
                        client: dict[str, object]) -> Rate:
    mask = len(values) - 1
    assert len(values) & mask == 0, "len(values) must be a power of two"
    conf = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": LINGER_MS, **client}
    async with Producer(conf) as p:
        await p.send_and_wait(topic, values[0])
        warm = p.metrics["records"]
        produce, checkpoint = p.produce, trio.lowlevel.checkpoint
        buffer_full = 0
        start = time.perf_counter()
        for i in range(n):
            value = values[i & mask]
            try:
                produce(topic, value)
            except BufferFull:
                buffer_full += 1
                await p.send(topic, value)  # waits (up to max.block.ms) for room
            if not i % CHECKPOINT_EVERY:
                await checkpoint()
        enqueued = time.perf_counter()
        await p.flush()
        elapsed = time.perf_counter() - start
        acked = p.metrics["records"] - warm
        errors = p.metrics["errors"]
        batches, requests = p.metrics["batches"], p.metrics["requests"]
    if acked != n or errors:
        raise RuntimeError(f"{acked:,} of {n:,} records acknowledged, {errors:,} failed")
    note = (f"+1 warm-up record before the clock; produce() loop {enqueued - start:.2f}s, "
            f"flush {elapsed - (enqueued - start):.2f}s, {batches:,} batches in {requests:,} requests")
    if buffer_full:
        note += f", buffer.memory full {buffer_full:,}x"
    return Rate(acked, acked * len(values[0]), elapsed, note=note)


def ours_consume(bootstrap: str, topic: str, partitions: int, expected: int,
                 stall_timeout_s: float = 60.0) -> Rate:
    """assign() every partition from the beginning and getmany() until `expected` records,
    summing the value lengths (as kafka_consume does with len(msg)).

    The clock starts at assign(); end_offsets() beforehand opens the connection and loads
    the metadata, as kafka_consume's list_topics() does.
    """
    return trio.run(_ours_consume, bootstrap, topic, partitions, expected, stall_timeout_s)


async def _ours_consume(bootstrap: str, topic: str, partitions: int, expected: int,
                        stall_timeout_s: float) -> Rate:
    tps = [(topic, p) for p in range(partitions)]
    async with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        ends = await c.end_offsets(tps)
        if sum(ends.values()) != expected:
            raise RuntimeError(f"{topic} holds {sum(ends.values()):,} records, expected {expected:,}")
        count = 0
        nbytes = 0
        start = time.perf_counter()
        last_progress = start
        c.assign(tps)
        while count < expected:
            batches = await c.getmany(timeout_s=5.0)
            now = time.perf_counter()
            if not batches:
                if now - last_progress > stall_timeout_s:
                    raise TimeoutError(f"consumer stalled: {count:,}/{expected:,} records after "
                                       f"{now - start:.1f}s, nothing for {stall_timeout_s:.0f}s")
                continue
            last_progress = now
            for records in batches.values():
                count += len(records)
                for r in records:
                    nbytes += len(r.value or b"")  # len(msg) is 0 for a null value too
        elapsed = time.perf_counter() - start
        fetches = c.metrics["fetches"]
    note = f"{fetches:,} fetches"
    if count != expected:
        note += f" (got {count:,} records, expected {expected:,})"
    return Rate(count, nbytes, elapsed, note=note)


# --------------------------------------------------------------------------- report


def _median(rates: list[Rate], attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in rates) if rates else float("nan")


def _median_cpu(rates: list[Rate], name: str) -> float:
    return statistics.median(r.cpu.get(name, float("nan")) for r in rates) if rates else float("nan")


def _row(label: str, rates: list[Rate]) -> str:
    if not rates:
        return f"{label:<46} {'FAILED':>11}"
    best = max(rates, key=lambda r: r.msg_s)
    broker = _median_cpu(rates, "broker") if "broker" in rates[0].cpu else _median_cpu(rates, "redis")
    return (f"{label:<46} {len(rates):>4} {best.msg_s:>11,.0f} {_median(rates, 'msg_s'):>11,.0f} "
            f"{best.mb_s:>7.1f} {_median(rates, 'mb_s'):>7.1f} {_median_cpu(rates, 'client'):>7.2f} "
            f"{broker:>7.2f}")


def _verdict(name: str, ours: list[Rate], theirs: list[Rate]) -> str:
    if not ours or not theirs:
        return f"{name}: n/a (missing figure) -> target >= {TARGET:g}x NOT ASSESSED"
    best = max(r.msg_s for r in ours) / max(r.msg_s for r in theirs)
    median = _median(ours, "msg_s") / _median(theirs, "msg_s")
    return (f"{name} ours/librdkafka msg/s: median {median:.2f}x, best {best:.2f}x -> "
            f"{'MET' if median >= TARGET else 'NOT MET'} (target >= {TARGET:g}x, judged on the median)")


@pytest.mark.timeout(1800)
def test_client_vs_librdkafka(tmp_path: Path) -> None:
    n = env_int("DCMIRROR_BENCH_CLIENT_RECORDS", 500_000)
    rounds = env_int("DCMIRROR_BENCH_CLIENT_ROUNDS", 2)
    with_redis = bool(env_int("DCMIRROR_BENCH_CLIENT_REDIS", 1)) and shutil.which("redis-server")
    values = payloads()
    n_codec = n // 2
    results: dict[str, list[Rate]] = {key: [] for key in (
        "rd_prod", "ours_prod", "ours_lz4", "ours_zstd", "rd_cons", "ours_cons", "redis_prod", "redis_cons")}
    details: list[str] = []
    failures: list[str] = []
    wall = time.perf_counter()

    print(f"\n=== client: {n:,} x {len(values[0])}-byte records, {PARTITIONS} partitions, "
          f"{rounds} rounds ===", flush=True)

    def run(key: str, label: str, broker: BrokerProcess, fn, *args: object, **kwargs: object) -> Rate | None:
        assert broker.proc is not None
        try:
            rate = measure({"broker": broker.proc.pid}, fn, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - reported with the broker log, the rest still runs
            failures.append(f"{label}: {exc!r}\n--- broker log tail ---\n{tail(broker.log_text(), 40)}")
            progress(f"{label}: FAILED {exc!r}")
            return None
        results[key].append(rate)
        progress(f"{label}: {rate.describe()}")
        details.append(f"{label + ':':<34} {rate.describe()}")
        return rate

    broker = BrokerProcess(tmp_path / "broker")
    try:
        broker.start()
        bs = broker.bootstrap

        def fresh_topic(name: str) -> tuple[str, int]:
            partitions, note = create_topic(bs, name, PARTITIONS)
            if note:
                details.append(f"topic {name}: {note}")
            return name, partitions

        consume_topic: tuple[str, int] | None = None
        for r in range(1, rounds + 1):
            topic, partitions = fresh_topic(f"client-rdkafka-{r}")
            if run("rd_prod", f"librdkafka produce #{r}", broker, rdkafka_produce, bs, topic, n, values) \
                    and consume_topic is None:
                consume_topic = (topic, partitions)
            topic, _ = fresh_topic(f"client-ours-{r}")
            run("ours_prod", f"ours produce #{r}", broker, ours_produce, bs, topic, n, values)
        for codec in ("lz4", "zstd"):
            topic, _ = fresh_topic(f"client-ours-{codec}")
            run(f"ours_{codec}", f"ours produce {codec}", broker, ours_produce, bs, topic, n_codec, values,
                **{"compression.type": codec})

        if consume_topic is None:
            failures.append("consume runs skipped: no librdkafka produce run succeeded")
        else:
            topic, partitions = consume_topic
            expected = n + 1  # + the warm-up record
            for r in range(1, rounds + 1):
                run("rd_cons", f"librdkafka consume #{r}", broker, kafka_consume, bs, topic, partitions, expected)
                run("ours_cons", f"ours consume #{r}", broker, ours_consume, bs, topic, partitions, expected)
    except Exception as exc:  # noqa: BLE001 - still report what was measured
        failures.append(f"dcmirror: {exc!r}\n--- broker log tail ---\n{tail(broker.log_text(), 40)}")
    finally:
        try:
            rc = broker.stop()
            if rc not in (0, None) and not failures:
                details.append(f"note: broker exited {rc} on SIGTERM")
        except Exception as exc:  # noqa: BLE001
            failures.append(f"dcmirror: broker did not stop on SIGTERM: {exc!r}")
    shutil.rmtree(broker.data_dir, ignore_errors=True)

    if with_redis:
        stream = b"bench-client"
        with RedisServer(tmp_path / "redis") as server:
            r = server.client()
            pids = {"redis": server.pid}
            try:
                for key, label, fn, args in (
                        ("redis_prod", "redis produce", redis_produce, (r, stream, n, values, REDIS_PIPELINE)),
                        ("redis_cons", "redis consume", redis_consume, (r, stream, n))):
                    rate = measure(pids, fn, *args)
                    results[key].append(rate)
                    progress(f"{label}: {rate.describe()}")
                    details.append(f"{label + ':':<34} {rate.describe()}")
            except Exception as exc:  # noqa: BLE001
                failures.append(f"redis: {exc!r}\n--- redis log tail ---\n{tail(server.log_text(), 20)}")
            finally:
                r.close()
        shutil.rmtree(tmp_path / "redis", ignore_errors=True)

    header = (f"{'client':<46} {'runs':>4} {'best msg/s':>11} {'med msg/s':>11} {'best':>7} {'med':>7} "
              f"{'client':>7} {'broker':>7}\n"
              f"{'':<46} {'':>4} {'':>11} {'':>11} {'MB/s':>7} {'MB/s':>7} {'CPU s':>7} {'CPU s':>7}")
    lines = [
        f"CLIENT  {n:,} records x {len(values[0])} B, one dcmirror broker, topics of {PARTITIONS} partitions; "
        f"producers acks=all enable.idempotence=true linger.ms={LINGER_MS}; clients alternate, "
        f"{rounds} run(s) each; CPU s = median per run",
        header,
        "PRODUCE (fresh topic per run)",
        _row("librdkafka (confluent_kafka)", results["rd_prod"]),
        _row("dcmirror trio client", results["ours_prod"]),
        _row(f"dcmirror trio client, lz4 ({n_codec:,} records)", results["ours_lz4"]),
        _row(f"dcmirror trio client, zstd ({n_codec:,} records)", results["ours_zstd"]),
        "CONSUME (assign all partitions from the beginning, same topic)",
        _row("librdkafka (confluent_kafka consume(10000))", results["rd_cons"]),
        _row("dcmirror trio client (getmany)", results["ours_cons"]),
    ]
    if with_redis:
        lines += [f"PEER  redis Streams (redis-py, XADD pipeline {REDIS_PIPELINE} / XREAD 10000; "
                  "broker CPU s = redis-server)",
                  _row("redis produce", results["redis_prod"]),
                  _row("redis consume", results["redis_cons"])]
    lines += [
        _verdict("produce", results["ours_prod"], results["rd_prod"]),
        _verdict("consume", results["ours_cons"], results["rd_cons"]),
        f"wall time {time.perf_counter() - wall:.0f}s",
        "",
        *details,
    ]
    if failures:
        lines += ["", "FAILURES:", *failures]
    emit("\n".join(lines))
    if failures:
        pytest.fail("client benchmark could not complete:\n" + "\n\n".join(failures), pytrace=False)
