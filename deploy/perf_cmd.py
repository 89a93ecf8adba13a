"""`dcmirror perf produce|consume`: like kafka-producer-perf-test / kafka-consumer-perf-test,
with the project's own client.

    dcmirror perf produce --bootstrap-server HOST:PORT --topic T --num-records N --record-size B
                          [--throughput R] [--producer-props k=v ...] [--json]
    dcmirror perf consume --bootstrap-server HOST:PORT --topic T --messages N [--group G]
                          [--consumer-props k=v ...] [--timeout MS] [--from-latest] [--json]

`--config FILE --cluster NAME` may stand in for --bootstrap-server. A progress line every
--reporting-interval ms (default 5000), then Kafka's summary; with --json the progress goes to
stderr and stdout holds one JSON document. Exit 0 when every record was acknowledged
(produce) or consumed (consume), 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import orjson
import trio

from deploy.perf_stats import ConsumerStats, ProducerStats, Throttler

# How many records the produce loop queues before it lets the sender run.
YIELD_EVERY_RECORDS = 256
BUFFER_FULL_WAIT_S = 0.001


class UsageError(Exception):
    """Bad arguments: exit 2 with the message."""


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    perf = sub.add_parser("perf", help="producer and consumer throughput and latency tests")
    tests = perf.add_subparsers(dest="perf_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--bootstrap-server", help="HOST:PORT[,HOST:PORT...] of the cluster")
        p.add_argument("--config", help="topology file (with --cluster, instead of --bootstrap-server)")
        p.add_argument("--cluster", help="cluster name in the topology file")
        p.add_argument("--topic", required=True, help="topic to write or read")
        p.add_argument("--reporting-interval", type=int, default=5000, metavar="MS",
                       help="time between progress lines (default 5000)")
        p.add_argument("--json", action="store_true", help="one JSON summary on stdout (progress on stderr)")

    produce = tests.add_parser("produce", help="like kafka-producer-perf-test")
    common(produce)
    produce.add_argument("--num-records", type=int, required=True, help="records to produce")
    produce.add_argument("--record-size", type=int, default=100, help="value size in bytes (default 100)")
    produce.add_argument("--throughput", type=float, default=-1,
                         help="at most this many records/s (-1: unlimited, the default)")
    produce.add_argument("--producer-props", nargs="+", default=[], metavar="KEY=VALUE",
                         help="producer configs with the Kafka client names, e.g. acks=1 linger.ms=10")
    produce.add_argument("--producer.config", "--command-config", dest="props_file", metavar="FILE",
                         help="producer properties file (security.protocol, sasl.*, ssl.*, ...; secrets as "
                              "${file:...}/${env:...}), as kafka-producer-perf-test; --producer-props win")
    produce.set_defaults(func=cmd_perf)

    consume = tests.add_parser("consume", help="like kafka-consumer-perf-test")
    common(consume)
    consume.add_argument("--messages", type=int, required=True, help="records to consume")
    consume.add_argument("--group", help="consume as this consumer group (default: assign every partition, "
                                          "no group)")
    consume.add_argument("--consumer-props", nargs="+", default=[], metavar="KEY=VALUE",
                         help="consumer configs with the Kafka client names, e.g. fetch.max.bytes=1048576")
    consume.add_argument("--consumer.config", "--command-config", dest="props_file", metavar="FILE",
                         help="consumer properties file (security.protocol, sasl.*, ssl.*, ...), as "
                              "kafka-consumer-perf-test; --consumer-props win")
    consume.add_argument("--timeout", type=int, default=10_000, metavar="MS",
                         help="give up after this long without a record (default 10000)")
    consume.add_argument("--from-latest", action="store_true",
                         help="start at the end of the partitions (default: the beginning)")
    consume.set_defaults(func=cmd_perf)


def parse_props(pairs: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} {pair!r} must be KEY=VALUE, e.g. linger.ms=10")
        out[key.strip()] = value.strip()
    return out


def bootstrap_of(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """The cluster's bootstrap and the client settings around the command's own props: the
    topology cluster's `client` table (--config --cluster), then the properties file."""
    from cluster.common.secrets import read_properties_file

    settings = read_properties_file(Path(args.props_file), "--producer.config/--consumer.config") \
        if args.props_file else {}
    if args.bootstrap_server:
        if args.config or args.cluster:
            raise UsageError("give --bootstrap-server or --config FILE --cluster NAME, not both")
        return str(args.bootstrap_server), settings
    if not (args.config and args.cluster):
        raise UsageError("--bootstrap-server HOST:PORT (or --config FILE --cluster NAME) is required")
    from topology import TopologyError, load

    try:
        spec = load(args.config).cluster(args.cluster)
    except (TopologyError, OSError) as exc:
        raise UsageError(str(exc)) from None
    return spec.bootstrap(), {**spec.client, **settings}


def cmd_perf(args: argparse.Namespace) -> int:
    from cluster.client.config import InvalidConfig
    from cluster.client.connection import KafkaConnectionError
    from cluster.client.errors import KafkaError, KafkaTimeoutError

    name = f"dcmirror perf {args.perf_command}"
    try:
        bootstrap, settings = bootstrap_of(args)
        if args.reporting_interval <= 0:
            raise UsageError("--reporting-interval must be positive")
        if args.perf_command == "produce":
            if args.num_records < 0 or args.record_size < 0:
                raise UsageError("--num-records and --record-size must not be negative")
            props = {**settings, **parse_props(args.producer_props, "--producer-props")}
            summary = trio.run(run_produce, bootstrap, args.topic, args.num_records, args.record_size,
                               args.throughput, props, args.reporting_interval / 1000, _progress_out(args))
            ok = summary["records"] == args.num_records
        else:
            if args.messages < 0 or args.timeout <= 0:
                raise UsageError("--messages must not be negative and --timeout must be positive")
            props = {**settings, **parse_props(args.consumer_props, "--consumer-props")}
            summary = trio.run(run_consume, bootstrap, args.topic, args.messages, args.group, props,
                               args.timeout / 1000, args.from_latest, args.reporting_interval / 1000,
                               _progress_out(args))
            ok = summary["records"] == args.messages
    except (UsageError, InvalidConfig) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    except (OSError, KafkaError, KafkaTimeoutError, KafkaConnectionError) as exc:  # unreachable cluster, unknown topic, ...
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(orjson.dumps(summary).decode())
    elif args.perf_command == "produce":
        print(ProducerStats.summary_line(summary))
    else:
        print(_consumer_table(summary))
    if summary.get("error"):
        print(f"{name}: {summary['error']}", file=sys.stderr)
    return 0 if ok else 1


def _progress_out(args: argparse.Namespace) -> Callable[[str], None]:
    stream: TextIO = sys.stderr if args.json else sys.stdout
    return lambda line: print(line, file=stream, flush=True)


def _consumer_table(s: dict[str, Any]) -> str:
    def stamp(ms: int) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f":{ms % 1000:03d}"

    header = ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
              "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
    row = (f"{stamp(s['start_time_ms'])}, {stamp(s['end_time_ms'])}, {s['mb']:.4f}, {s['mb_per_sec']:.4f}, "
           f"{s['records']}, {s['records_per_sec']:.4f}, {s['rebalance_time_ms']}, {s['fetch_time_ms']}, "
           f"{s['fetch_mb_per_sec']:.4f}, {s['fetch_records_per_sec']:.4f}")
    return header + "\n" + row


async def _report_every(interval_s: float, line: Callable[[float], str], out: Callable[[str], None]) -> None:
    while True:
        await trio.sleep(interval_s)
        out(line(time.perf_counter()))


# ---- produce -----------------------------------------------------------------------------


async def run_produce(bootstrap: str, topic: str, num_records: int, record_size: int, throughput: float,
                      props: dict[str, str], interval_s: float, out: Callable[[str], None]) -> dict[str, Any]:
    from cluster.client.accumulator import BufferFull
    from cluster.client.errors import KafkaTimeoutError
    from cluster.client.producer import Producer

    # One random payload of uppercase letters, reused (as kafka-producer-perf-test does).
    rng = random.Random(0)
    payload = bytes(rng.randrange(65, 91) for _ in range(record_size))
    config = {"bootstrap.servers": bootstrap, "client.id": "dcmirror-perf-producer", **props}
    async with Producer(config) as producer:
        # The topic's metadata first, so the first records are not held back waiting for it.
        # The client never auto-creates topics (Kafka's perf test leans on the broker doing it).
        try:
            await producer.cluster.wait_for_topic(topic, producer.max_block_s)
        except KafkaTimeoutError as exc:
            if "UNKNOWN_TOPIC_OR_PARTITION" not in str(exc):
                raise
            raise KafkaTimeoutError(f"{exc}; create it first: dcmirror topics create {topic} --bootstrap "
                                    f"{bootstrap} --partitions N --replication-factor R") from None
        clock = time.perf_counter
        start = clock()
        stats = ProducerStats(num_records, record_size, start)
        throttler = Throttler(throughput)
        counted = producer.metrics  # records acknowledged / failed, kept by the producer

        def delivered(sent_s: float, metadata: Any, error: Exception | None) -> None:
            if error is not None:
                stats.failed(error)
            else:
                stats.latency((clock() - sent_s) * 1000)

        def progress(now_s: float) -> str:
            stats.update(counted["records"], counted["errors"])
            return stats.progress_line(now_s)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_report_every, interval_s, progress, out)
            produce = producer.produce
            sample_every = stats.sample_every
            for i in range(num_records):
                sent_s = clock()
                callback = functools.partial(delivered, sent_s) if i % sample_every == 0 else None
                while True:
                    try:
                        produce(topic, payload, on_delivery=callback)
                        break
                    except BufferFull:
                        await trio.sleep(BUFFER_FULL_WAIT_S)  # the sender drains; room comes back
                if throughput > 0:
                    delay = throttler.delay_s(i + 1, sent_s - start)
                    if delay > 0:
                        await trio.sleep(delay)
                        continue
                if i % YIELD_EVERY_RECORDS == 0:
                    await trio.lowlevel.checkpoint()
            try:
                await producer.flush(producer.delivery_timeout_s)
            finally:
                nursery.cancel_scope.cancel()
        stats.update(counted["records"], counted["errors"])
        summary = stats.summary(clock())
    if stats.errors:
        summary["error"] = f"{stats.errors} records failed; first error: {stats.first_error}"
    return summary


# ---- consume -----------------------------------------------------------------------------


async def run_consume(bootstrap: str, topic: str, messages: int, group: str | None, props: dict[str, str],
                      timeout_s: float, from_latest: bool, interval_s: float,
                      out: Callable[[str], None]) -> dict[str, Any]:
    from cluster.client.consumer import Consumer

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "client.id": "dcmirror-perf-consumer",
                              "auto.offset.reset": "latest" if from_latest else "earliest", **props}
    if group:
        config["group.id"] = group
    start_wall = time.time()
    start = time.perf_counter()
    stats = ConsumerStats(start)
    assigned_at: list[float] = []
    result: dict[str, Any] = {}
    async with Consumer(config) as consumer:
        if group:
            async def on_assign(partitions: list[tuple[str, int]]) -> None:
                if not assigned_at:
                    assigned_at.append(time.perf_counter())

            consumer.subscribe([topic], on_assign=on_assign)
        else:
            count = await consumer.cluster.wait_for_topic(topic, timeout_s)
            consumer.assign([(topic, p) for p in range(count)])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_report_every, interval_s, stats.progress_line, out)
            last_s = time.perf_counter()
            while stats.count < messages:
                got = await consumer.getmany(min(1.0, timeout_s), max_records=messages - stats.count)
                now = time.perf_counter()
                if not got:
                    if now - last_s >= timeout_s:
                        result["error"] = (f"exiting before consuming the expected number of records: "
                                           f"{timeout_s * 1000:.0f} ms passed without one")
                        break
                    continue
                last_s = now
                n = size = 0
                for records in got.values():
                    n += len(records)
                    for r in records:
                        size += (len(r.key) if r.key is not None else 0) + (len(r.value) if r.value is not None else 0)
                stats.consumed(n, size, now)
            nursery.cancel_scope.cancel()
        now = time.perf_counter()
        rebalance_s = (assigned_at[0] - start) if assigned_at else 0.0
        summary = stats.summary(rebalance_s=rebalance_s, now_s=now, start_wall_s=start_wall)
    return summary | result
