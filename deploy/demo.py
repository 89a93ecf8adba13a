"""`dcmirror demo`: the embedded default topology end to end, in a temporary directory.

1. a copy of topology/default.toml with free ports (datacenters east and west, 3 brokers
   each, a 3-broker aggregate in central; data and warehouse in the temporary directory),
   secured as the file says (mutual TLS between brokers, SASL_SSL for the mirror and the
   operator's commands, plaintext on loopback for local producers) with a CA, certificates
   and passwords `dcmirror dev-secrets` makes up on the fly, run by `dcmirror up` (brokers,
   topics, mirror workers, the warehouse service and the web console); the file gives each
   cluster a schema registry, east and west an `orders` topic (mirrored with the others; the
   flows copy its schemas into the aggregate's registry under contexts .east and .west, ids
   kept) and the warehouse a typed table for it ([warehouse.registry_schemas]);
2. a traffic generator (the project's own producer) writing pageview and click events —
   JSON with user, url and ts, keyed by user — into east and west; and orders written with
   confluent-kafka's serializers against each datacenter's own registry: Avro
   (AvroSerializer) in east, JSON Schema (JSONSerializer) in west;
3. waits until the mirror has copied every source partition (lag 0 everywhere) and checks
   that the aggregate's registry holds both datacenters' order schemas with their ids;
4. `dcmirror load`: the aggregate's topics into the warehouse tables, the orders into typed
   tables whose columns come from the registry (east_orders from Avro, west_orders from
   JSON Schema);
5. two Spark SQL queries over the tables: records, distinct source records, users and top
   url per datacenter and topic; and orders, quantity and amount per datacenter and product,
   read from the typed columns of both datacenters' tables. Then a summary of the records per
   datacenter and topic in the sources, the aggregate (read back, each source offset exactly
   once) and the warehouse, and everything is stopped.

Exit 0 only if the counts match everywhere (no record lost or doubled on the way), the
typed columns included (orders, quantity and amount per datacenter and product as produced).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import trio

from deploy.dev_secrets import dev_secrets
from deploy.processes import dcmirror_argv
from topology import ClusterSpec, Topology, default_topology_text, load

DEFAULT_RECORDS = 20_000
TOPICS = ("pageviews", "clicks")
CLICK_SHARE = 0.3  # of each datacenter's events
USERS = 5_000
PAGES = 200
UP_READY_TIMEOUT_S = 180.0
MIRROR_TIMEOUT_S = 180.0
LOAD_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 90.0
PROGRESS_INTERVAL_S = 2.0
ADDRESS = re.compile(r'"127\.0\.0\.1:(\d+)"')
ORDERS_TOPIC = "orders"
ORDERS_PER_EVENT = 0.05  # orders produced per pageview/click event (at least one per datacenter)
PRODUCTS = ("book", "lamp", "mug", "pen")
ORDER_FORMATS = ("Avro", "JSON Schema")  # the first source datacenter's, the second's, ... (alternating)
REGISTRY_TIMEOUT_S = 120.0
REGISTRY_POLL_S = 0.2

# The order's schema in both formats: the same fields, so the two typed tables line up.
ORDER_AVRO = json.dumps({
    "type": "record", "name": "Order", "namespace": "dcmirror.demo", "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "user", "type": "string"},
        {"name": "product", "type": {"type": "enum", "name": "Product", "symbols": list(PRODUCTS)}},
        {"name": "quantity", "type": "int"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]})
ORDER_JSON_SCHEMA = json.dumps({
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
    "properties": {"order_id": {"type": "string"}, "user": {"type": "string"},
                   "product": {"type": "string", "enum": list(PRODUCTS)}, "quantity": {"type": "integer"},
                   "amount": {"type": "number"}, "ts": {"type": "string", "format": "date-time"}},
    "required": ["order_id", "user", "product", "quantity", "amount", "ts"]})


class DemoFailed(Exception):
    """A step of the demo failed; the message says which and why."""


def say(text: str = "") -> None:
    print(text, flush=True)


def step(number: int, text: str) -> None:
    say(f"\n== {number}/5 {text}")


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def demo_text() -> str:
    """The demo's topology: the default on free ports, without the warehouse service. The
    demo runs one load and its queries in one Spark session; a service's Spark start beside
    the clusters' made the demo slower on 2 cores (65 s against 53 s, README)."""
    text = demo_topology_text(default_topology_text())
    service = '"load.service" = "true"'
    if service not in text:
        raise DemoFailed("the default topology is not the one the demo knows (no load.service): see deploy/demo.py")
    return text.replace(service, '"load.service" = "false"', 1)


PORT_TRIES = 50


def demo_topology_text(text: str) -> str:
    """The default topology with every loopback address moved to a free port (data dirs
    and the warehouse path are relative, so they land beside the file). The ports derived
    from them (a broker's admin HTTP at its port + admin.http.port.offset) must be free and
    distinct too: a set of ports where one is not is drawn again (deploy/ports.py, as `up`
    checks them)."""
    from deploy.ports import clashes, in_use, listen_addresses
    from topology import loads

    ports = sorted({int(m) for m in ADDRESS.findall(text)})
    for _ in range(PORT_TRIES):
        moved = _moved(text, dict(zip(ports, free_ports(len(ports)), strict=True)))
        addresses = listen_addresses(loads(moved, check_files=False))
        if not clashes(addresses) and not in_use(addresses):
            return moved
    raise DemoFailed(f"no set of free ports for the demo's topology in {PORT_TRIES} draws")


def _moved(text: str, mapping: dict[int, int]) -> str:
    return ADDRESS.sub(lambda m: f'"127.0.0.1:{mapping[int(m.group(1))]}"', text)


def local_client(spec: ClusterSpec) -> dict[str, str]:
    """Client settings of a producer on the cluster's own host: the plaintext loopback
    listener LOCAL where the topology has one, else the cluster's client settings."""
    if "LOCAL" in spec.listeners:
        return {"bootstrap.servers": spec.bootstrap("LOCAL")}
    return spec.client_config()


def table_name(topic: str) -> str:
    """The warehouse table of an aggregate topic (non-alphanumerics become '_')."""
    return "dcmirror." + re.sub(r"[^0-9A-Za-z]", "_", topic)


@dataclass(frozen=True)
class Stream:
    """One source topic of one datacenter and where it lands."""

    cluster: str
    datacenter: str
    topic: str
    target_cluster: str
    target_topic: str

    @property
    def label(self) -> str:
        return f"{self.datacenter}/{self.topic}"


def streams_of(topology: Topology) -> list[Stream]:
    out = []
    for flow in topology.mirrors:
        source = topology.cluster(flow.source)
        for t in topology.topics_of(source.name):
            if flow.matches(t.name):
                out.append(Stream(source.name, source.datacenter, t.name, flow.target,
                                  flow.target_topic(t.name, source.datacenter)))
    return out


# ---- `dcmirror up` as a child process ---------------------------------------------------------


class UpProcess:
    """`dcmirror up --config FILE`; its lines are echoed (indented) and watched for readiness."""

    def __init__(self, config: Path, log_path: Path) -> None:
        self.log_path = log_path
        self.ready = threading.Event()
        self.lines: list[str] = []
        self.echo = True
        self.proc = subprocess.Popen(
            dcmirror_argv("up", "--config", str(config), "--timeout", str(UP_READY_TIMEOUT_S)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True, cwd=config.parent)
        self._reader = threading.Thread(target=self._read, name="dcmirror-up-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log_path, "ab") as log:
            for raw in self.proc.stdout:
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace").rstrip()
                self.lines.append(line)
                if self.echo:
                    say(f"   up | {line}")
                if "dcmirror up: ready" in line:
                    self.ready.set()

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.2):
            if self.proc.poll() is not None:
                raise DemoFailed(f"dcmirror up exited ({self.proc.returncode}) before it was ready; "
                                 f"its output is in {self.log_path}")
            if time.monotonic() > deadline:
                raise DemoFailed(f"dcmirror up was not ready within {timeout_s:g} s; see {self.log_path}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            say(f"dcmirror up did not stop within {STOP_TIMEOUT_S:g} s: SIGKILL")
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(10)
        return code


# ---- traffic ---------------------------------------------------------------------------------


@dataclass
class Traffic:
    acked: dict[tuple[str, str], int] = field(default_factory=dict)
    failed: int = 0
    first_error: str | None = None
    elapsed_s: float = 0.0


def event(rng: random.Random, topic: str, ts_ms: int) -> tuple[bytes, bytes]:
    """(key, value) of one pageview or click: JSON with user, url and ts, keyed by user."""
    user = f"user-{rng.randrange(USERS)}"
    # A few pages get most of the views (Zipf-like), so the example query has a clear top 5.
    page = min(int(rng.paretovariate(1.2)) - 1, PAGES - 1)
    url = f"/page/{page}" if topic == "pageviews" else f"/page/{page}#buy"
    value = json.dumps({"user": user, "url": url, "ts": ts_ms}, separators=(",", ":")).encode()
    return user.encode(), value


async def produce_traffic(topology: Topology, records: int, seed: int,
                          progress: Callable[[int, float], None]) -> Traffic:
    """`records` events split evenly over the source datacenters, CLICK_SHARE of each are
    clicks; every datacenter written by its own idempotent producer (acks=all), at once."""
    from cluster.client.accumulator import BufferFull
    from cluster.client.producer import Producer

    sources = sorted({s.cluster for s in streams_of(topology)})
    traffic = Traffic()
    sent = [0]
    started = time.monotonic()

    async def write(cluster: str, count: int, rng: random.Random) -> None:
        spec = topology.cluster(cluster)

        def delivered(topic: str) -> Callable[[Any, Exception | None], None]:
            key = (cluster, topic)

            def report(_metadata: Any, error: Exception | None) -> None:
                if error is None:
                    traffic.acked[key] = traffic.acked.get(key, 0) + 1
                else:
                    traffic.failed += 1
                    traffic.first_error = traffic.first_error or f"{cluster}/{topic}: {error}"
            return report

        callbacks = {t: delivered(t) for t in TOPICS}
        async with Producer({**local_client(spec), "acks": "all", "enable.idempotence": True,
                             "linger.ms": 10, "compression.type": "lz4",
                             "client.id": f"dcmirror-demo-{cluster}"}) as producer:
            for i in range(count):
                topic = "clicks" if rng.random() < CLICK_SHARE else "pageviews"
                key, value = event(rng, topic, int(time.time() * 1000))
                while True:
                    try:
                        producer.produce(topic, value, key, on_delivery=callbacks[topic])
                        break
                    except BufferFull:
                        await trio.sleep(0.005)
                sent[0] += 1
                if i % 256 == 255:
                    await trio.lowlevel.checkpoint()  # let the sender ship batches
            await producer.flush(120)

    async def report() -> None:
        while True:
            await trio.sleep(PROGRESS_INTERVAL_S)
            progress(sent[0], time.monotonic() - started)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(report)
        async with trio.open_nursery() as writers:
            for i, cluster in enumerate(sources):
                count = records // len(sources) + (1 if i < records % len(sources) else 0)
                writers.start_soon(write, cluster, count, random.Random(f"{seed}-{cluster}"))
        nursery.cancel_scope.cancel()
    traffic.elapsed_s = time.monotonic() - started
    return traffic


# ---- orders: Avro and JSON Schema through each datacenter's registry ---------------------------


@dataclass
class Orders:
    """What the orders' producers had acknowledged, per (cluster, product): [orders, quantity,
    amount in cents]; the format each cluster wrote; the schema id each registered."""

    acked: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    formats: dict[str, str] = field(default_factory=dict)
    schema_ids: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    first_error: str | None = None
    elapsed_s: float = 0.0

    def count(self, cluster: str) -> int:
        return sum(v[0] for (c, _), v in self.acked.items() if c == cluster)


def order(rng: random.Random, cluster: str, n: int, ts_ms: int) -> dict[str, Any]:
    """One order (Avro's types: amount a Decimal, ts milliseconds)."""
    cents = rng.randrange(199, 20_000)
    return {"order_id": f"{cluster}-{n}", "user": f"user-{rng.randrange(USERS)}", "product": rng.choice(PRODUCTS),
            "quantity": rng.randint(1, 5), "amount": Decimal(cents).scaleb(-2), "ts": ts_ms}


def as_json_order(record: dict[str, Any]) -> dict[str, Any]:
    """The same order as the JSON Schema declares it: amount a number, ts RFC 3339 text."""
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record["ts"] / 1000)) + f".{record['ts'] % 1000:03d}Z"
    return {**record, "amount": float(record["amount"]), "ts": ts}


def wait_registry(url: str, log_path: Path, timeout_s: float) -> None:
    """Until the registry at `url` answers GET /subjects (`dcmirror up` starts the registries
    with the mirror workers and does not wait for them)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/subjects", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(REGISTRY_POLL_S)
    raise DemoFailed(f"the schema registry at {url} did not answer within {timeout_s:g} s ({last}); its log: {log_path}")


def produce_orders(topology: Topology, streams: list[Stream], count: int, seed: int) -> Orders:
    """`count` orders split evenly over the datacenters with an orders topic, each written by
    confluent-kafka's Producer (librdkafka, idempotent, acks=all) with the value serialized
    against that datacenter's own registry: Avro in the first, JSON Schema in the second, ...
    The datacenters at once, a thread each (their registries start at the same time)."""
    clusters = sorted({s.cluster for s in streams if s.topic == ORDERS_TOPIC})
    started = time.monotonic()
    parts: dict[str, Orders | BaseException] = {}

    def write(i: int, cluster: str) -> None:
        try:
            n = count // len(clusters) + (1 if i < count % len(clusters) else 0)
            parts[cluster] = _produce_orders(topology, cluster, ORDER_FORMATS[i % len(ORDER_FORMATS)], n,
                                             random.Random(f"{seed}-{cluster}-orders"))
        except BaseException as exc:  # noqa: BLE001 - raised again by the caller's thread
            parts[cluster] = exc

    threads = [threading.Thread(target=write, args=(i, c), name=f"dcmirror-demo-orders-{c}", daemon=True)
               for i, c in enumerate(clusters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REGISTRY_TIMEOUT_S + 180)
    orders = Orders()
    for cluster in clusters:
        part = parts.get(cluster)
        if isinstance(part, BaseException):
            raise part
        if part is None:
            raise DemoFailed(f"{cluster}'s orders producer did not finish")
        orders.acked.update(part.acked)
        orders.formats.update(part.formats)
        orders.schema_ids.update(part.schema_ids)
        orders.failed += part.failed
        orders.first_error = orders.first_error or part.first_error
    orders.elapsed_s = time.monotonic() - started
    return orders


class OrdersRun:
    """produce_orders in a thread of its own (librdkafka and the serializers block), started with
    `dcmirror up`: each datacenter's orders go out as soon as its registry answers, while the
    mirror workers are still starting (a registry's first write waits for its election: the
    group's initial rebalance delay, 3 s)."""

    def __init__(self, topology: Topology, records: int, seed: int) -> None:
        self.streams = [s for s in streams_of(topology) if s.topic == ORDERS_TOPIC]
        self.count = max(len(self.streams), int(records * ORDERS_PER_EVENT))
        self._result: Orders | BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(topology, seed), name="dcmirror-demo-orders",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self, topology: Topology, seed: int) -> None:
        try:
            self._result = produce_orders(topology, self.streams, self.count, seed)
        except BaseException as exc:  # noqa: BLE001 - raised again by result(), in the demo's thread
            self._result = exc

    def result(self) -> Orders:
        self._thread.join(UP_READY_TIMEOUT_S + REGISTRY_TIMEOUT_S + 180)
        got = self._result
        if isinstance(got, DemoFailed):
            raise DemoFailed(f"orders: {got}")
        if isinstance(got, BaseException):
            raise DemoFailed(f"orders: {type(got).__name__}: {got}") from got
        if got is None:
            raise DemoFailed("orders: the producer thread did not finish")
        return got


def _produce_orders(topology: Topology, cluster: str, fmt: str, count: int, rng: random.Random) -> Orders:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    spec = topology.cluster(cluster)
    if spec.registry is None:
        raise DemoFailed(f"cluster {cluster} has an {ORDERS_TOPIC} topic and no schema registry")
    orders = Orders(formats={cluster: fmt})
    # dcmirror up starts the registries once the clusters are ready and the topics made
    wait_registry(spec.registry.url, Path(spec.data_dir) / "registry.log", UP_READY_TIMEOUT_S + REGISTRY_TIMEOUT_S)
    registry = SchemaRegistryClient({"url": spec.registry.url})
    conf = {"auto.register.schemas": True}  # subject orders-value (TopicNameStrategy)
    if fmt == "Avro":
        serializer = AvroSerializer(registry, ORDER_AVRO, conf=conf)
        to_value: Callable[[dict[str, Any]], dict[str, Any]] = dict
    else:
        serializer = JSONSerializer(ORDER_JSON_SCHEMA, registry, conf=conf)
        to_value = as_json_order

    def delivered(record: dict[str, Any]) -> Callable[[Any, Any], None]:
        def report(error: Any, _message: Any) -> None:
            if error is None:
                tally = orders.acked.setdefault((cluster, record["product"]), [0, 0, 0])
                tally[0] += 1
                tally[1] += record["quantity"]
                tally[2] += int(record["amount"] * 100)
            else:
                orders.failed += 1
                orders.first_error = orders.first_error or f"{cluster}/{ORDERS_TOPIC}: {error}"
        return report

    ctx = SerializationContext(ORDERS_TOPIC, MessageField.VALUE)
    producer = Producer({**local_client(spec), "acks": "all", "enable.idempotence": True, "linger.ms": 10,
                         "client.id": f"dcmirror-demo-orders-{cluster}"})
    for k in range(count):
        record = order(rng, cluster, k, int(time.time() * 1000))
        value = serializer(to_value(record), ctx)
        while True:
            try:
                producer.produce(ORDERS_TOPIC, key=record["user"].encode(), value=value,
                                 on_delivery=delivered(record))
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(120)
    if left:
        orders.failed += left
        orders.first_error = orders.first_error or f"{cluster}/{ORDERS_TOPIC}: {left} not delivered in 120 s"
    orders.schema_ids[cluster] = int(registry.get_latest_version(f"{ORDERS_TOPIC}-value").schema_id or 0)
    return orders


def check_schemas_synced(topology: Topology, orders: Orders, target: str) -> list[str]:
    """The aggregate registry's copies of each datacenter's orders-value: (lines to print);
    DemoFailed when one is missing or has another id than its source's."""
    import httpx

    spec = topology.cluster(target).registry
    if spec is None:
        raise DemoFailed(f"cluster {target} has no schema registry to hold the datacenters' schemas")
    out = []
    for cluster, schema_id in sorted(orders.schema_ids.items()):
        subject = f":.{cluster}:{ORDERS_TOPIC}-value"
        answer = httpx.get(f"{spec.url}/subjects/{subject}/versions/latest", timeout=10.0)
        if answer.status_code != 200:
            raise DemoFailed(f"schema sync: the aggregate registry {spec.url} has no subject {subject} "
                             f"(HTTP {answer.status_code}: {answer.text[:200]})")
        got = answer.json()
        if got["id"] != schema_id:
            raise DemoFailed(f"schema sync: {subject} in the aggregate registry has id {got['id']}, {cluster}'s "
                             f"{ORDERS_TOPIC}-value has id {schema_id}")
        out.append(f"{subject} ({got.get('schemaType', 'AVRO')}, id {got['id']} as in {cluster}'s registry)")
    return out


# ---- counting ----------------------------------------------------------------------------------


async def source_offsets(topology: Topology) -> dict[tuple[str, str, int], tuple[int, int]]:
    """(cluster, topic, partition) -> (log start offset, log end offset) of every source topic."""
    from cluster.client.admin import EARLIEST, LATEST, Admin

    out: dict[tuple[str, str, int], tuple[int, int]] = {}
    for cluster in sorted({s.cluster for s in streams_of(topology)}):
        local = local_client(topology.cluster(cluster))
        async with Admin(local.pop("bootstrap.servers"), client_id="dcmirror-demo", config=local) as admin:
            tps = [(t.name, p) for t in topology.topics_of(cluster) for p in range(t.partitions)]
            starts = await admin.list_offsets(tps, EARLIEST)
            ends = await admin.list_offsets(tps, LATEST)
        for tp in tps:
            out[(cluster, tp[0], tp[1])] = (starts[tp], ends[tp])
    return out


@dataclass
class AggregateCount:
    records: int = 0
    duplicates: int = 0
    missing: int = 0
    fences: int = 0


async def count_aggregate(topology: Topology, stream: Stream,
                          offsets: dict[tuple[str, str, int], tuple[int, int]]) -> AggregateCount:
    """Read the stream's target topic to its end: records with provenance from the stream's
    source, checked against the source's offsets (each exactly once); fences skipped."""
    from cluster.client.consumer import Consumer
    from mirror.provenance import FENCE, SOURCE_CLUSTER, SOURCE_OFFSET, SOURCE_PARTITION, header

    partitions = [p for (c, t, p) in offsets if c == stream.cluster and t == stream.topic]
    seen: dict[int, set[int]] = {p: set() for p in partitions}
    result = AggregateCount()
    async with Consumer({**topology.cluster(stream.target_cluster).client_config(), "auto.offset.reset": "earliest",
                         "client.id": "dcmirror-demo", "enable.auto.commit": False}) as consumer:
        tps = [(stream.target_topic, p) for p in partitions]
        ends = await consumer.end_offsets(tps)
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        remaining = {tp for tp in tps if ends[tp] > 0}
        with trio.fail_after(120):
            while remaining:
                for tp, records in (await consumer.getmany(timeout_s=1.0)).items():
                    for r in records:
                        if header(r.headers, FENCE) is not None or header(r.headers, SOURCE_OFFSET) is None:
                            result.fences += 1
                            continue
                        source = (header(r.headers, SOURCE_CLUSTER) or b"").decode()
                        partition = int(header(r.headers, SOURCE_PARTITION) or b"-1")
                        offset = int(header(r.headers, SOURCE_OFFSET) or b"-1")
                        if source != stream.cluster or partition not in seen:
                            raise DemoFailed(f"{stream.target_topic}-{tp[1]} offset {r.offset} came from "
                                             f"{source} partition {partition}, not from {stream.cluster}")
                        if offset in seen[partition]:
                            result.duplicates += 1
                        seen[partition].add(offset)
                    if (consumer.position(tp) or 0) >= ends[tp]:
                        remaining.discard(tp)
    for p, got in seen.items():
        start, end = offsets[(stream.cluster, stream.topic, p)]
        result.records += len(got)
        result.missing += len(set(range(start, end)) - got)
    return result


def wait_mirrored(topology: Topology, offsets: dict[tuple[str, str, int], tuple[int, int]],
                  timeout_s: float) -> tuple[float, int]:
    """Until every source partition is reported by a live worker as copied to its end (lag 0
    at the log end offset we know). Returns (seconds waited, largest lag seen)."""
    from deploy.mirror_cmd import flow_reports

    started = time.monotonic()
    last_print = 0.0
    max_lag = 0
    while True:
        reported: dict[tuple[str, str, int], int] = {}  # source offset copied up to
        for f in flow_reports(topology, list(topology.mirrors)):
            for w in f["workers"]:
                if not w.get("reachable"):
                    continue
                for p in w.get("partitions", []):
                    key = (f["source"], p["topic"], p["partition"])
                    reported[key] = max(reported.get(key, 0), p["acked_offset"] + 1)
        behind = 0
        for key, (_start, end) in offsets.items():
            copied = reported.get(key, 0)
            behind += max(0, end - copied)
        max_lag = max(max_lag, behind)
        if behind == 0:
            return time.monotonic() - started, max_lag
        waited = time.monotonic() - started
        if waited - last_print >= PROGRESS_INTERVAL_S:
            last_print = waited
            say(f"   mirror: {behind:,} records still to copy ({waited:.0f} s)")
        if waited > timeout_s:
            raise DemoFailed(f"the mirror did not catch up within {timeout_s:g} s: {behind:,} records behind; "
                             "see the worker logs under the data directory's mirror/ folder")
        time.sleep(0.25)


# ---- the warehouse (dcmirror load, dcmirror warehouse sql) -----------------------------------


def run_dcmirror(args: list[str], cwd: Path, timeout_s: float, echo: bool) -> tuple[int, str, float]:
    """A `dcmirror ...` subprocess in `cwd`: (exit code, its output, seconds). The demo's own
    directory, not the caller's: Spark's Python workers put their working directory on
    sys.path, where any stray grp.py or tarfile.py would shadow the standard library."""
    started = time.monotonic()
    proc = subprocess.Popen(dcmirror_argv(*args), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines: list[str] = []
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            if echo:
                say(f"   {args[0]} | {line}")
        code = proc.wait()
    finally:
        timer.cancel()
    if killed.is_set():
        raise DemoFailed(f"`dcmirror {args[0]}` did not finish within {timeout_s:g} s, the demo's limit for this step "
                         f"(stopped); its last line: {(lines or [''])[-1][:300]!r}")
    return code, "\n".join(lines), time.monotonic() - started


QUERY_LINE = re.compile(r"^query: \d+ row\(s\)(?: \(truncated\))? in ([\d.]+) s")


def warehouse_query(streams: list[Stream]) -> str:
    """One Spark SQL query over the four tables: per datacenter and topic the records, the
    distinct source records (provenance: source topic id, partition, leader epoch and
    offset: a re-created topic's offsets and a diverged copy count apart), the distinct users
    and the most frequent url (fields read from the JSON values)."""
    union = "\n  UNION ALL\n".join(
        f"  SELECT '{s.target_topic}' AS topic, source_dc, source_topic_id, source_partition,\n"
        f"         source_leader_epoch, source_offset,\n"
        f"         get_json_object(CAST(value AS STRING), '$.user') AS user,\n"
        f"         get_json_object(CAST(value AS STRING), '$.url') AS url\n"
        f"  FROM {table_name(s.target_topic)}" for s in streams)
    return ("SELECT source_dc AS dc, topic, count(*) AS records,\n"
            "       count(DISTINCT coalesce(source_topic_id, ''), source_partition,\n"
            "                      coalesce(source_leader_epoch, -1), source_offset) AS distinct_records,\n"
            "       count(DISTINCT user) AS users, mode(url) AS top_url\n"
            f"FROM (\n{union}\n)\nGROUP BY source_dc, topic ORDER BY topic")


def orders_query(streams: list[Stream], formats: dict[str, str]) -> str:
    """One Spark SQL query over the typed orders tables of every datacenter: per datacenter
    (source_cluster provenance) and product the orders, the distinct source records, the
    quantity and amount summed and the latest order time, all read from typed columns."""
    union = "\n  UNION ALL\n".join(
        f"  SELECT '{formats.get(s.cluster, '?')}' AS format, source_cluster, source_partition, source_offset,\n"
        f"         product, quantity, amount, ts\n"
        f"  FROM {table_name(s.target_topic)}" for s in streams)
    return ("SELECT source_cluster, format, product, count(*) AS orders,\n"
            "       count(DISTINCT source_partition, source_offset) AS distinct_orders,\n"
            "       sum(quantity) AS quantity, CAST(sum(amount) AS DECIMAL(12, 2)) AS amount, max(ts) AS last_order\n"
            f"FROM (\n{union}\n)\nGROUP BY source_cluster, format, product ORDER BY product, source_cluster")


def query_answers(lines: list[str]) -> list[tuple[float, Any]]:
    """(seconds, rows) of each `--query` of a `dcmirror load`: its `query: N row(s)` line and the
    JSON array on the line after it."""
    out = []
    for i, line in enumerate(lines):
        asked = QUERY_LINE.search(line)
        if asked:
            try:
                rows = json.loads(lines[i + 1]) if i + 1 < len(lines) else None
            except json.JSONDecodeError:
                rows = None
            out.append((float(asked.group(1)), rows))
    return out


def check_orders(rows: list[dict[str, Any]], orders: Orders) -> list[str]:
    """Problems of the typed query's rows against what the orders' producers had acknowledged:
    every (datacenter, product) exactly once, with exactly the orders, quantity and amount."""
    problems = []
    got = {(r["source_cluster"], r["product"]): r for r in rows}
    if len(got) != len(rows):
        problems.append(f"typed query: {len(rows)} rows for {len(got)} (datacenter, product) pairs")
    for key in sorted(set(got) | set(orders.acked)):
        r = got.get(key)
        want = orders.acked.get(key, [0, 0, 0])
        if r is None:
            problems.append(f"typed query: no row for {key[0]}/{key[1]}; {want[0]} orders were produced")
            continue
        amount = Decimal(str(r["amount"])) if r["amount"] is not None else None
        if (r["orders"], r["distinct_orders"], r["quantity"], amount) != (want[0], want[0], want[1],
                                                                           Decimal(want[2]).scaleb(-2)):
            problems.append(f"typed query: {key[0]}/{key[1]} has {r['orders']} orders ({r['distinct_orders']} "
                            f"distinct), quantity {r['quantity']}, amount {r['amount']}; produced {want[0]} orders, "
                            f"quantity {want[1]}, amount {Decimal(want[2]).scaleb(-2)}")
        if r["format"] != orders.formats.get(key[0]) or r["last_order"] is None:
            problems.append(f"typed query: {key[0]}/{key[1]} says format {r['format']}, last order "
                            f"{r['last_order']}; {key[0]} wrote {orders.formats.get(key[0])}")
    return problems


# ---- the demo --------------------------------------------------------------------------------


def _table(rows: list[list[str]], right: int = 1) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) if i < right else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]


def keep_running(topology: Topology, workdir: Path, up: UpProcess) -> None:
    """--keep: the deployment stays up, with its web console, until Ctrl-C (or SIGTERM)."""
    console = topology.console
    where = f"{console.url}/" if console is not None else "(no [console] in the topology)"
    say(f"\n== the deployment keeps running: web console on {where}")
    say(f"   log in as admin, password: the admin line of {workdir / 'secrets' / 'passwords.properties'}")
    say("   Ctrl-C stops everything")
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set() and up.proc.poll() is None:
            stop.wait(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_demo(records: int = DEFAULT_RECORDS, *, keep: bool = False, as_json: bool = False, seed: int = 1) -> int:
    if records < 1:
        print("dcmirror demo: --records must be at least 1", file=sys.stderr)
        return 2
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        print("dcmirror demo: the warehouse load runs Spark, which needs a Java runtime (17): install one "
              "(`make sysdeps` does: apt-get install openjdk-17-jre-headless) or set JAVA_HOME", file=sys.stderr)
        return 2
    try:
        import confluent_kafka.schema_registry.avro  # noqa: F401 - the orders' serializers
        import confluent_kafka.schema_registry.json_schema  # noqa: F401
    except ImportError as exc:
        print(f"dcmirror demo: the orders are written with confluent-kafka's Avro and JSON Schema serializers "
              f"({exc}): pip install 'confluent-kafka[avro,json,schemaregistry]' (`make demo` installs it)",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="dcmirror-demo-"))
    config = workdir / "topology.toml"
    config.write_text(demo_text())
    made = dev_secrets(config)  # a CA, the brokers' certificate and passwords, made up on the fly
    topology = load(config)
    say(f"dcmirror demo: the default topology with free ports, everything under {workdir}")
    say(f"   secured as a deployment across datacenters would be: mutual TLS between brokers, SASL_SSL "
        f"(SCRAM) for the mirror and operators, plaintext on loopback for local producers; "
        f"{len(made.files)} certificate files and {len(made.passwords)} passwords made up under "
        f"{workdir / 'secrets'}")
    # set-up: the secrets made up and the topology written and read
    summary: dict[str, Any] = {"ok": False, "records": records, "workdir": str(workdir),
                               "phases_s": {"set-up": round(time.monotonic() - started, 1)}}
    up: UpProcess | None = None
    try:
        step(1, "dcmirror up: 3 clusters (east, west, aggregate) x 3 brokers, a schema registry each, topics, "
                "mirror workers, the web console, the warehouse service")
        up_started = time.monotonic()
        up = UpProcess(config, workdir / "up.log")
        orders = OrdersRun(topology, records, seed)
        orders.start()
        up.wait_ready(UP_READY_TIMEOUT_S + 30)
        summary["phases_s"]["clusters up"] = round(time.monotonic() - up_started, 1)
        up.echo = False  # from here on its lines go to up.log only (restarts are still printed below)
        summary.update(_demo_steps(topology, config, records, seed, up, orders, summary["phases_s"]))
    except DemoFailed as exc:
        say(f"\ndcmirror demo FAILED: {exc}")
        summary["error"] = str(exc)
    except KeyboardInterrupt:
        say("\ndcmirror demo: interrupted")
        summary["error"] = "interrupted"
    except Exception as exc:  # noqa: BLE001 - reported, then everything is stopped as usual
        traceback.print_exc()
        say(f"\ndcmirror demo FAILED: {type(exc).__name__}: {exc}")
        summary["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if up is not None and keep and summary.get("ok"):
            keep_running(topology, workdir, up)
        if up is not None:
            say("\n== stopping (dcmirror up: mirror workers, then every cluster with controlled shutdowns)")
            stopping = time.monotonic()
            code = up.stop()
            say(f"   dcmirror up exited {code}; " + (up.lines[-1] if up.lines else ""))
            summary.setdefault("phases_s", {})["stop"] = round(time.monotonic() - stopping, 1)
        summary["elapsed_s"] = round(time.monotonic() - started, 1)
        if keep or not summary["ok"]:
            say(f"data, logs and topology kept in {workdir} (dcmirror status --config {config})")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    phases = summary.get("phases_s", {})
    say(f"\ndcmirror demo: {'OK' if summary['ok'] else 'FAILED'} in {summary['elapsed_s']:.0f} s"
        + (" (" + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items()) + ")" if phases else ""))
    if as_json:
        print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] else 1


def _demo_steps(topology: Topology, config: Path, records: int, seed: int, up: UpProcess, orders_run: OrdersRun,
                phases: dict[str, float]) -> dict[str, Any]:
    """Steps 2 to 5; each one's seconds go into `phases` as it ends (so a failed demo still
    shows where the time went)."""
    started = time.monotonic()
    streams = streams_of(topology)
    events = [s for s in streams if s.topic in TOPICS]
    order_streams = orders_run.streams
    sources = sorted({s.cluster for s in streams})
    step(2, f"traffic: {records:,} pageview and click events (JSON user/url/ts, keyed by user) into "
            f"{' and '.join(sources)}, with the project's idempotent producer (acks=all); and "
            f"{orders_run.count:,} orders with confluent-kafka's serializers against each datacenter's registry ("
            + ", ".join(f"{s.cluster} {ORDER_FORMATS[i % len(ORDER_FORMATS)]}" for i, s in
                        enumerate(sorted(order_streams, key=lambda s: s.cluster)))
            + "), started with step 1 as soon as each registry answered")
    say(f"   e.g. {event(random.Random(seed), 'pageviews', 1_700_000_000_000)[1].decode()}")
    example = order(random.Random(seed), "east", 0, 1_700_000_000_000)
    say(f"   and an order: {json.dumps(as_json_order(example), separators=(',', ':'))} (in Avro: amount a "
        "decimal(9, 2), product an enum, ts a timestamp-millis)")

    def progress(sent: int, elapsed_s: float) -> None:
        say(f"   produced {sent:,} of {records:,} ({sent / max(elapsed_s, 1e-9):,.0f} records/s)")

    traffic = trio.run(produce_traffic, topology, records, seed, progress)
    acked = sum(traffic.acked.values())
    say(f"   {acked:,} records acknowledged in {traffic.elapsed_s:.1f} s "
        f"({acked / max(traffic.elapsed_s, 1e-9):,.0f} records/s), {traffic.failed} failed")
    if traffic.failed:
        raise DemoFailed(f"{traffic.failed} records were not acknowledged; first: {traffic.first_error}")
    orders = orders_run.result()
    if orders.failed:
        raise DemoFailed(f"orders: {orders.failed} were not acknowledged; first: {orders.first_error}")
    for cluster, fmt in sorted(orders.formats.items()):
        traffic.acked[(cluster, ORDERS_TOPIC)] = orders.count(cluster)
        say(f"   {orders.count(cluster):,} orders acknowledged in {cluster} ({fmt}, schema id "
            f"{orders.schema_ids[cluster]} of {cluster}'s {ORDERS_TOPIC}-value)")
    say(f"   orders took {orders.elapsed_s:.1f} s from `dcmirror up`'s start (waiting for the registries included)")
    offsets = trio.run(source_offsets, topology)
    phases["traffic"] = round(time.monotonic() - started, 1)
    started = time.monotonic()

    step(3, "mirror: waiting until every source partition is copied into the aggregate (lag 0)")
    caught_up_s, max_lag = wait_mirrored(topology, offsets, MIRROR_TIMEOUT_S)
    say(f"   lag 0 on all {len(offsets)} source partitions, {caught_up_s:.1f} s after the last acknowledgement")
    aggregate = {s: trio.run(count_aggregate, topology, s, offsets) for s in streams}
    fences = sum(a.fences for a in aggregate.values())
    say(f"   read back from the aggregate: {sum(a.records for a in aggregate.values()):,} records "
        f"(+{fences} fence records the workers wrote when they took their partitions)")
    targets = sorted({s.target_cluster for s in order_streams})
    for target in targets:
        say(f"   schemas copied by the flows into {target}'s registry: "
            + "; ".join(check_schemas_synced(topology, orders, target)))
    phases["mirror caught up"] = round(time.monotonic() - started, 1)

    step(4, "warehouse load: dcmirror load (Spark, local mode) from the aggregate into Parquet tables (the orders "
            "into typed tables, columns from the aggregate's registry), then the queries of step 5 in the same "
            "Spark session")
    query = warehouse_query(events)
    typed_query = orders_query(order_streams, orders.formats)
    code, output, total_s = run_dcmirror(["load", "--config", str(config), "--query", query, "--query", typed_query],
                                         config.parent, LOAD_TIMEOUT_S, echo=False)
    lines = output.splitlines()
    for line in lines:
        if not line.startswith("["):
            say(f"   load | {line}")
    if code != 0:
        raise DemoFailed(f"dcmirror load exited {code}" + (
            " (this build has no `dcmirror load` command)" if "invalid choice: 'load'" in output else ""))
    answers = query_answers(lines)
    sql_s = sum(seconds for seconds, _ in answers)
    load_s = total_s - sql_s
    say(f"   load took {load_s:.1f} s (Spark's start included)")
    phases["load"] = round(load_s, 1)
    if len(answers) != 2 or not all(isinstance(found, list) for _, found in answers):
        raise DemoFailed(f"dcmirror load --query --query: not two JSON arrays after `query:` lines; the last line: "
                         f"{(lines or [''])[-1][:200]!r}")
    rows: list[dict[str, Any]] = answers[0][1]
    typed_rows: list[dict[str, Any]] = answers[1][1]

    step(5, "the warehouse: two Spark SQL queries (`dcmirror warehouse sql` runs them on its own), the second "
            "over the typed columns of east's Avro and west's JSON Schema orders")
    def show(sql: str, result: list[dict[str, Any]], right: int) -> None:
        for line in sql.splitlines():
            say(f"   | {line}")
        if result:
            cols = list(result[0])
            for line in _table([cols] + [[f"{r[c]:,}" if isinstance(r[c], int) else str(r[c]) for c in cols]
                                         for r in result], right=right):
                say(f" {line}")

    show(query, rows, 2)
    say("")
    show(typed_query, typed_rows, 3)
    say(f"   ({sql_s:.1f} s in the load's Spark session: no second JVM or metastore start)")
    phases["query"] = round(sql_s, 1)
    warehouse: dict[str, dict[str, int]] = {}
    problems: list[str] = []
    for r in rows:
        w = warehouse.setdefault(r["topic"], {"records": 0, "distinct_records": 0})
        w["records"] += int(r["records"])
        w["distinct_records"] += int(r["distinct_records"])
    for s in order_streams:
        mine = [r for r in typed_rows if r["source_cluster"] == s.cluster]
        warehouse[s.target_topic] = {"records": sum(int(r["orders"]) for r in mine),
                                     "distinct_records": sum(int(r["distinct_orders"]) for r in mine)}
    problems += check_orders(typed_rows, orders)
    source_count = {s: sum(e - b for (c, t, _), (b, e) in offsets.items() if c == s.cluster and t == s.topic)
                    for s in streams}
    for s in events:
        stray = [r["dc"] for r in rows if r["topic"] == s.target_topic and r["dc"] != s.datacenter]
        if stray:
            problems.append(f"{table_name(s.target_topic)} holds rows of datacenter(s) {', '.join(stray)}, "
                            f"not only {s.datacenter}")

    counts: dict[str, Any] = {}
    table = [["DATACENTER", "TOPIC", "PRODUCED", "SOURCE", "AGGREGATE", "WAREHOUSE", "TABLE"]]
    totals = [0, 0, 0, 0]
    for s in streams:
        w = warehouse.get(s.target_topic, {"records": 0, "distinct_records": 0})
        row = {"produced": traffic.acked.get((s.cluster, s.topic), 0), "source": source_count[s],
               "aggregate": aggregate[s].records, "warehouse": w["records"],
               "warehouse_distinct": w["distinct_records"],
               "aggregate_duplicates": aggregate[s].duplicates, "aggregate_missing": aggregate[s].missing}
        counts[s.target_topic] = row
        values = [row["produced"], row["source"], row["aggregate"], row["warehouse"]]
        totals = [a + b for a, b in zip(totals, values, strict=True)]
        typed = f" (typed, {orders.formats.get(s.cluster)})" if s in order_streams else ""
        table.append([s.datacenter, s.topic, *(f"{v:,}" for v in values), table_name(s.target_topic) + typed])
        if len(set(values)) != 1 or row["warehouse_distinct"] != row["warehouse"]:
            problems.append(f"{s.label}: produced {values[0]}, source {values[1]}, aggregate {values[2]}, "
                            f"warehouse {values[3]} ({row['warehouse_distinct']} distinct)")
        if aggregate[s].duplicates or aggregate[s].missing:
            problems.append(f"{s.label}: the aggregate has {aggregate[s].duplicates} duplicates and misses "
                            f"{aggregate[s].missing} source offsets")
    table.append(["total", "", *(f"{v:,}" for v in totals), ""])

    restarts = [line for line in up.lines if "restarting in" in line]
    say("\n== summary")
    for line in _table(table, right=2):
        say(line)
    say(f"\n   mirror: lag 0 records on every one of the {len(offsets)} source partitions; the aggregate caught up "
        f"{caught_up_s:.1f} s after the last record was acknowledged (largest backlog seen then: {max_lag:,} records)")
    say(f"   traffic: {acked:,} records in {traffic.elapsed_s:.1f} s; warehouse load: {load_s:.1f} s; "
        f"warehouse queries: {sql_s:.1f} s")
    if restarts:
        say(f"   dcmirror up restarted processes {len(restarts)} time(s): " + "; ".join(restarts[:3]))
    if problems:
        say("\n   MISMATCH:")
        for p in problems:
            say(f"   - {p}")
    else:
        say(f"\n   every record produced is in the sources, the aggregate and the warehouse exactly once "
            f"({totals[0]:,} records), and the typed orders columns of "
            + " and ".join(f"{c} ({f})" for c, f in sorted(orders.formats.items()))
            + " sum to what was produced")
    return {"ok": not problems, "problems": problems, "counts": counts,
            "traffic_s": round(traffic.elapsed_s, 2), "mirror_catch_up_s": round(caught_up_s, 2),
            "mirror_lag_records": 0, "load_s": round(load_s, 2), "sql_s": round(sql_s, 2), "query": query,
            "example": rows, "typed_query": typed_query, "typed": typed_rows,
            "orders": {f"{c}/{p}": v for (c, p), v in sorted(orders.acked.items())},
            "order_formats": orders.formats, "order_schema_ids": orders.schema_ids}
