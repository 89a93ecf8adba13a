"""Kafka's scale, side by side: thousands of partitions on one broker, dcmirror beside Apache
Kafka (the pinned peer, `make peers`), the same settings on both (test_vs_kafka's
BENCH_BROKER_CONFIG), systems alternated.

Run with `make bench` (or `pytest -m perf -q -s tests/perf/test_scale.py`). Knobs:

  DCMIRROR_BENCH_SCALE_PARTITIONS  partition counts, comma-separated (default 1000,10000)
  DCMIRROR_BENCH_SCALE_RECORDS     records produced and consumed across them (default 200,000)
  DCMIRROR_BENCH_SCALE_ROUNDS      rounds per count, systems alternated (default 1)
  DCMIRROR_BENCH_SCALE_BROKERS     brokers per system (default 1): a cluster of 3 combined
                                   broker+controller nodes on both sides; memory is the sum
                                   of the nodes', the Fetch row one broker's Fetch of the
                                   partitions it leads, kill -9 and restart node 1. A broker
                                   holds partitions / brokers; on this machine a process may
                                   open at most 20,000 files (hard limit), and Kafka keeps
                                   each partition's segment open: 3 x 10,000 fits, 100,000
                                   on 3 brokers does not.

Per partition count N (topics of 100 partitions, RF 1), on a fresh one-broker system:
  1. create: CreateTopics of every topic (10 per request) until Metadata shows every
     partition with a leader;
  2. resident memory of the broker process, minus what it held before the topics, per partition;
  3. Metadata (v12, every topic) answered: the first answer to a new question, the median of
     the next 5, and the answer's bytes;
  4. a consumer's sessionless Fetch (v13) of every partition while they are empty, answered
     at once: the median of 5 once every partition answers, and its bytes;
  5. librdkafka producing N-spread records (record i to partition i mod N), acks=1, and a
     librdkafka consumer assigned every partition from offset 0 reading them back
     (sessionless: librdkafka has no fetch sessions); then the same with Kafka's Java
     producer and KafkaConsumer (fetch sessions, KIP-227: after the first Fetch a broker
     answers and the consumer asks only for partitions that changed): N more records, read
     back from the end offsets before them;
  6. kill -9 and restart: until Metadata has a leader for every partition and a write to the
     last partition is acknowledged; with several brokers also a kill -9 of the active
     controller (DescribeQuorum's leader) until a new topic is created;
  7. delete: DeleteTopics of every topic until Metadata shows none.
Also DescribeTopicPartitions (KIP-966) of every topic, every page of 2,000 partitions.
Nothing is asserted about speed; a table per count goes to tests/perf/results/latest.txt as
soon as it is measured, the medians to tests/perf/results/scale.json
(`python -m tests.perf.plot_scale` draws docs/images/scale.svg from them).
"""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cluster.protocol.messages import decode_response, encode_request
from tests.cluster_helpers import wait_until
from tests.kafka.test_java_clients import JavaDriver, compile_driver
from tests.peers.kafka import KAFKA_VERSION
from tests.perf.benchlib import Alternated, consumer_conf, emit, env_int, progress
from tests.perf.test_vs_kafka import BENCH_BROKER_CONFIG, SYSTEMS, System, rss_mib

pytestmark = pytest.mark.perf

TOPIC_PARTITIONS = 100
VALUE = b"x" * 100


def counts() -> list[int]:
    import os

    raw = os.environ.get("DCMIRROR_BENCH_SCALE_PARTITIONS", "1000,10000")
    return [int(x) for x in raw.split(",") if x.strip()]


def topics_for(n: int) -> list[str]:
    return [f"scale-{i:04d}" for i in range(max(1, n // TOPIC_PARTITIONS))]


def leaders_ready(admin: AdminClient, topics: list[str], partitions: int) -> bool:
    md = admin.list_topics(timeout=30)
    for name in topics:
        t = md.topics.get(name)
        if t is None or t.error is not None or len(t.partitions) != partitions or any(
                p.leader < 0 for p in t.partitions.values()):
            return False
    return True


def create_all(bootstrap: str, topics: list[str]) -> float:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    t0 = time.perf_counter()
    for i in range(0, len(topics), 10):
        batch = topics[i:i + 10]
        futures = admin.create_topics([NewTopic(t, TOPIC_PARTITIONS, 1) for t in batch], request_timeout=300)
        for f in futures.values():
            f.result(timeout=300)
    wait_until(lambda: leaders_ready(admin, topics, TOPIC_PARTITIONS), 1800, "every partition with a leader",
               interval_s=0.1)
    return time.perf_counter() - t0


def delete_all(bootstrap: str, topics: list[str]) -> float:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    t0 = time.perf_counter()
    for i in range(0, len(topics), 10):
        for f in admin.delete_topics(topics[i:i + 10], request_timeout=300).values():
            f.result(timeout=300)
    wait_until(lambda: not set(topics) & set(admin.list_topics(timeout=30).topics), 1800, "topics gone",
               interval_s=0.1)
    return time.perf_counter() - t0


def metadata_round_trip(bootstrap: str, tries: int = 6) -> tuple[float, float, int]:
    """Metadata v12 for every topic over a raw socket: (seconds of the first answer, median
    seconds of the next ones, answer bytes). The question (with topic authorized operations)
    is one no client asked before, so the first answer is built from scratch on both sides
    (dcmirror keeps answers encoded per question and metadata offset)."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    client = b"scale-bench"
    # Header v2: api key 3, version 12, correlation id, client id, no tags; body: topics
    # null (compact: 0), allow_auto_topic_creation false, include_topic_authorized_operations
    # true, no tags.
    times, size = [], 0
    with socket.create_connection((host, int(port)), timeout=60) as s:
        for corr in range(tries):
            body = struct.pack(">hhih", 3, 12, corr, len(client)) + client + b"\x00" + b"\x00\x00\x01\x00"
            t0 = time.perf_counter()
            s.sendall(struct.pack(">i", len(body)) + body)
            (length,) = struct.unpack(">i", _read(s, 4))
            _read(s, length)
            times.append(time.perf_counter() - t0)
            size = length
    rest = sorted(times[1:])
    return times[0], rest[len(rest) // 2], size


def fetch_round_trip(bootstrap: str, topics: list[str], tries: int = 5) -> tuple[float, int, int]:
    """A consumer's sessionless Fetch (v13, as librdkafka sends it) of every partition at
    offset 0 while all are empty, answered at once (max wait 0): (median seconds, answer
    bytes). The broker's cost of the request a consumer of N partitions without fetch
    sessions sends every fetch.wait.max.ms when nothing is new. Measured once every partition
    answers without error (Kafka's replicas take leadership a little after its Metadata shows
    the leader: NOT_LEADER_OR_FOLLOWER until then). Timed from sending the request to the
    answer's last byte."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(encode_request(3, 12, 0, b"scale-bench", {"topics": [{"name": t} for t in topics]}))
        (length,) = struct.unpack(">i", _read(s, 4))
        metadata = decode_response(3, 12, _read(s, length))
        ids = {t.name: t.topic_id for t in metadata.topics}
        # The partitions this broker leads (all of them on one broker).
        node = next(b.node_id for b in metadata.brokers if (b.host, b.port) == (host, int(port)))
        led = {t.name: sorted(p.partition_index for p in t.partitions if p.leader_id == node)
               for t in metadata.topics}
        request = {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 50 << 20, "isolation_level": 0,
                   "session_id": 0, "session_epoch": -1, "rack_id": "",
                   "topics": [{"topic_id": ids[t], "partitions": [
                       {"partition": q, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                        "log_start_offset": -1, "partition_max_bytes": 1 << 20} for q in led[t]]}
                              for t in topics if led.get(t)]}
        wanted = sum(len(t["partitions"]) for t in request["topics"])
        correlation = 0

        def once() -> tuple[float, int, list[tuple[int, int, int]]]:
            nonlocal correlation
            correlation += 1
            frame = encode_request(1, 13, correlation, b"scale-bench", request)
            t0 = time.perf_counter()
            s.sendall(frame)
            (length,) = struct.unpack(">i", _read(s, 4))
            raw = _read(s, length)
            took = time.perf_counter() - t0  # to the last byte: the client's decoding is not the broker's
            answer = decode_response(1, 13, raw)
            parts = [p for t in answer.responses for p in t.partitions]
            assert answer.error_code == 0 and len(parts) == wanted, answer.error_code
            return took, length, [(p.partition_index, p.error_code, len(p.records or b"")) for p in parts
                                  if p.error_code or p.records]

        odd = once()[2]
        deadline = time.monotonic() + 300
        while odd and time.monotonic() < deadline:
            time.sleep(0.2)
            odd = once()[2]
        assert not odd, f"empty partitions answered errors or records: {odd[:5]} ({len(odd)} in all)"
        times, size = [], 0
        for _ in range(tries):
            took, size, odd = once()
            assert not odd, f"empty partitions answered errors or records: {odd[:5]} ({len(odd)} in all)"
            times.append(took)
    times.sort()
    return times[len(times) // 2], size, wanted


def _ask(s: socket.socket, api_key: int, version: int, correlation: int,
         body: dict[str, object]) -> tuple[object, int, float]:
    """One request over a raw socket: (decoded answer, answer bytes, seconds from sending the
    request to the answer's last byte: the client's decoding, in Python, is not counted)."""
    request = encode_request(api_key, version, correlation, b"scale-bench", body)
    t0 = time.perf_counter()
    s.sendall(request)
    (length,) = struct.unpack(">i", _read(s, 4))
    raw = _read(s, length)
    elapsed = time.perf_counter() - t0
    return decode_response(api_key, version, raw), length, elapsed


def describe_partitions_round_trip(bootstrap: str, topics: list[str], tries: int = 4) -> tuple[float, float, int, int]:
    """DescribeTopicPartitions (v0, KIP-966) of every topic, every page (the answer holds at
    most 2,000 partitions; its cursor names where the next page starts): (seconds of the first
    whole walk, median seconds of the next ones, bytes of a walk, pages). A walk's seconds are
    its pages' round trips, the client's decoding of each page left out."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    times: list[float] = []
    size = pages = 0
    with socket.create_connection((host, int(port)), timeout=120) as s:
        for attempt in range(tries):
            cursor = None
            size = pages = 0
            walk_s = 0.0
            while True:
                answer, length, elapsed = _ask(s, 75, 0, attempt * 10_000 + pages, {
                    "topics": [{"name": t} for t in topics], "response_partition_limit": 2000, "cursor": cursor})
                walk_s += elapsed
                size += length
                pages += 1
                nxt = answer.next_cursor  # type: ignore[attr-defined]
                if nxt is None:
                    break
                cursor = {"topic_name": nxt.topic_name, "partition_index": nxt.partition_index}
            times.append(walk_s)
    rest = sorted(times[1:])
    return times[0], rest[len(rest) // 2], size, pages


def active_controller(bootstrap: str) -> int:
    """The KRaft leader (DescribeQuorum through a broker, as kafka-metadata-quorum asks)."""
    for address in bootstrap.split(","):
        host, port = address.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=10) as s:
                answer, _, _ = _ask(s, 55, 2, 1, {"topics": [{"topic_name": "__cluster_metadata",
                                                           "partitions": [{"partition_index": 0}]}]})
            leader = int(answer.topics[0].partitions[0].leader_id)  # type: ignore[attr-defined]
            if leader >= 0:
                return leader
        except OSError:
            continue
    raise AssertionError(f"no broker of {bootstrap} named the active controller")


def controller_failover(system: System, bootstrap: str, topics: list[str]) -> float:
    """kill -9 of the active controller until a new topic is created (CreateTopics answered
    by the new controller); the killed node is then started again and every partition waited
    for, outside the time."""
    node = active_controller(bootstrap)
    system.kill9(node)
    t0 = time.perf_counter()
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    name = f"scale-failover-{int(t0)}"

    def created() -> bool:
        # CreateTopics answered is the new controller at work; the topic's leader may be the
        # killed node (placed before its session ran out), so it is not waited for.
        try:
            admin.create_topics([NewTopic(name, 1, 1)], request_timeout=10)[name].result(timeout=15)
        except Exception as exc:  # noqa: BLE001 - retried until the new controller answers
            return "already exists" in str(exc)
        return True

    wait_until(created, 1800, "a topic created after the controller's kill -9", interval_s=0.2)
    took = time.perf_counter() - t0
    system.restart(node)
    wait_until(lambda: leaders_ready(admin, topics, TOPIC_PARTITIONS), 1800, "leaders after the restart",
               interval_s=0.5)
    admin.delete_topics([name])
    return took


def _read(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(min(1 << 20, n - len(out)))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return bytes(out)


def produce_spread(bootstrap: str, topics: list[str], records: int, first: int = 0) -> float:
    """Record i (from `first`) to topic i mod T, partition (i // T) mod 100: msg/s until all
    are acknowledged."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "log_level": 2,
                  "queue.buffering.max.messages": 1_000_000})
    p.list_topics(timeout=30)
    failed = []
    t0 = time.perf_counter()
    count = len(topics)
    for i in range(first, first + records):
        while True:
            try:
                p.produce(topics[i % count], VALUE, partition=(i // count) % TOPIC_PARTITIONS,
                          on_delivery=lambda err, _m: err and failed.append(err))
                break
            except BufferError:
                p.poll(0.01)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(600) == 0 and not failed, failed[:3]
    return records / (time.perf_counter() - t0)


def consume_spread(bootstrap: str, topics: list[str], records: int) -> float:
    """msg/s of a librdkafka consumer assigned every partition from offset 0 (the log start
    of these new topics). Not OFFSET_BEGINNING: librdkafka then sends a ListOffsets request
    per partition, and at 10,000 partitions it sent a few hundred of them ~12 s late, against
    Kafka and dcmirror alike (debug=protocol), which made this row swing 4x from run to run."""
    c = Consumer(consumer_conf(bootstrap))
    try:
        c.list_topics(timeout=30)
        t0 = time.perf_counter()
        c.assign([TopicPartition(t, q, 0) for t in topics for q in range(TOPIC_PARTITIONS)])
        got = 0
        last = time.perf_counter()
        while got < records:
            msgs = c.consume(10_000, 1.0)
            if msgs:
                last = time.perf_counter()
            elif time.perf_counter() - last > 120:
                raise TimeoutError(f"consumed {got} of {records}")
            got += sum(1 for m in msgs if m.error() is None)
        return records / (time.perf_counter() - t0)
    finally:
        c.close()


def java_spread(driver: JavaDriver, bootstrap: str, topics: list[str], records: int) -> tuple[float, float]:
    """Kafka's Java producer appending `records` more over the same partitions, and a
    KafkaConsumer reading them back from where they begin (the log end offsets before):
    (produce msg/s, consume msg/s)."""
    prefix = topics[0].rsplit("-", 1)[0]
    (line,) = driver.run("spread", timeout_s=1800, bootstrap=bootstrap, prefix=prefix, topics=len(topics),
                         partitions=TOPIC_PARTITIONS, records=records)
    assert line["records"] == records, line
    progress(f"Java consumer: {line['fetches']:.0f} fetches")
    return records / line["produce_s"], records / line["consume_s"]


def restart_to_write(system: System, bootstrap: str, topics: list[str]) -> float:
    system.kill9(1)
    t0 = time.perf_counter()
    system.restart(1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wait_until(lambda: leaders_ready(admin, topics, TOPIC_PARTITIONS), 1800, "leaders after restart",
               interval_s=0.1)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 600_000, "log_level": 2})
    acked: list[float] = []
    p.produce(topics[-1], b"after", partition=TOPIC_PARTITIONS - 1,
              on_delivery=lambda err, _m: err is None and acked.append(time.perf_counter()))
    p.flush(600)
    assert acked, "the write after the restart was not acknowledged"
    return acked[0] - t0


ROWS = (  # (key, label, unit)
    ("create", "create until all have leaders", "s"),
    ("rss", "resident memory per partition (KiB)", "KiB"),
    ("metadata_first_ms", "Metadata, every topic, first answer (ms)", "ms"),
    ("metadata_ms", "Metadata, the same again (ms)", "ms"),
    ("metadata_kib", "Metadata answer (KiB)", "KiB"),
    ("dtp_first_ms", "DescribeTopicPartitions, every page, first walk (ms)", "ms"),
    ("dtp_ms", "DescribeTopicPartitions, every page, again (ms)", "ms"),
    ("dtp_kib", "DescribeTopicPartitions answers (KiB)", "KiB"),
    ("fetch_ms", "Fetch of every partition, none new (ms)", "ms"),
    ("fetch_kib", "Fetch answer (KiB)", "KiB"),
    ("produce", "produce {records:,} spread (msg/s)", "/s"),
    ("consume", "consume them, assigned (msg/s)", "/s"),
    ("java_produce", "produce {records:,} spread, Java producer (msg/s)", "/s"),
    ("java_consume", "consume them, Java consumer with fetch sessions (msg/s)", "/s"),
    ("restart", "kill -9 to first write (s)", "s"),
    ("failover", "kill -9 of the active controller to a topic created (s)", "s"),
    ("delete", "delete until gone (s)", "s"),
)
FIGURES_FILE = Path(__file__).parent / "results" / "scale.json"


@pytest.mark.timeout(8 * 3600)
def test_thousands_of_partitions_on_one_broker_beside_kafka(tmp_path: Path) -> None:
    records = env_int("DCMIRROR_BENCH_SCALE_RECORDS", 200_000)
    rounds = env_int("DCMIRROR_BENCH_SCALE_ROUNDS", 1)
    brokers = env_int("DCMIRROR_BENCH_SCALE_BROKERS", 1)
    where = "one broker" if brokers == 1 else f"{brokers} brokers"
    figures_file = FIGURES_FILE if brokers == 1 else FIGURES_FILE.with_name(f"scale-{brokers}-brokers.json")
    fetched = 0
    driver = compile_driver(tmp_path / "java-classes")
    figures = Alternated()
    saved: dict[str, dict[str, dict[str, float | None]]] = {}  # system → count → row → median
    failures: list[str] = []  # rows that could not be measured, and why
    for n in counts():
        topics = topics_for(n)
        total = len(topics) * TOPIC_PARTITIONS
        for round_no in range(rounds):
            order = SYSTEMS if round_no % 2 == 0 else SYSTEMS[::-1]
            for name, start in order:
                progress(f"{total:,} partitions, round {round_no + 1}/{rounds}: {name}")
                with start(tmp_path / f"{name}-{total}-{round_no}", brokers) as system:
                    bootstrap = system.bootstrap
                    time.sleep(2)
                    base_mib = sum(rss_mib(pid) for pid in system.pids)
                    figures.add(f"{total}:create", name, create_all(bootstrap, topics))
                    time.sleep(2)
                    figures.add(f"{total}:rss", name,
                                (sum(rss_mib(pid) for pid in system.pids) - base_mib) * 1024 / total)
                    first, rtt, size = metadata_round_trip(bootstrap)
                    figures.add(f"{total}:metadata_first_ms", name, first * 1000)
                    figures.add(f"{total}:metadata_ms", name, rtt * 1000)
                    figures.add(f"{total}:metadata_kib", name, size / 1024)
                    first, rtt, size, _pages = describe_partitions_round_trip(bootstrap, topics)
                    figures.add(f"{total}:dtp_first_ms", name, first * 1000)
                    figures.add(f"{total}:dtp_ms", name, rtt * 1000)
                    figures.add(f"{total}:dtp_kib", name, size / 1024)
                    rtt, size, fetched = fetch_round_trip(bootstrap, topics)
                    figures.add(f"{total}:fetch_ms", name, rtt * 1000)
                    figures.add(f"{total}:fetch_kib", name, size / 1024)
                    figures.add(f"{total}:produce", name, produce_spread(bootstrap, topics, records))
                    figures.add(f"{total}:consume", name, consume_spread(bootstrap, topics, records))
                    try:
                        java_produce, java_consume = java_spread(driver, bootstrap, topics, records)
                    except AssertionError as exc:  # a row that failed says so; the others go on
                        lines = str(exc).splitlines()
                        reason = " / ".join([lines[0].strip(), *[line.strip() for line in lines
                                                                  if "Exception" in line][-2:]])[:600]
                        failures.append(f"{total:,} partitions, {name}: the Java clients' row failed: {reason}")
                        progress(failures[-1])
                    else:
                        figures.add(f"{total}:java_produce", name, java_produce)
                        figures.add(f"{total}:java_consume", name, java_consume)
                    figures.add(f"{total}:restart", name, restart_to_write(system, bootstrap, topics))
                    if brokers > 1:  # one broker is its own controller: nothing to fail over to
                        figures.add(f"{total}:failover", name, controller_failover(system, bootstrap, topics))
                    figures.add(f"{total}:delete", name, delete_all(bootstrap, topics))
        rows = [(f"{total}:{key}", f"{total:,}: " + label.format(records=records), unit) for key, label, unit in ROWS]
        # A table per count as soon as it is measured: a later count that fails keeps these.
        emit("\n".join([
            f"=== {total:,} partitions on {where} beside Apache Kafka {KAFKA_VERSION} "
            f"(topics of {TOPIC_PARTITIONS}, RF 1, {rounds} round(s)) ===",
            "the same broker settings on both sides: " + ", ".join(f"{k}={v}" for k, v in BENCH_BROKER_CONFIG.items()),
            *([] if brokers == 1 else [f"memory: the {brokers} nodes' sum; the Fetch row: node 1's Fetch of the "
                                       f"{fetched:,} partitions it leads; restart: node 1"]),
            figures.render(where, rows, ("dcmirror", f"Kafka {KAFKA_VERSION}")),
            "ratio: dcmirror / Kafka (for times and memory lower is better); load: 1-minute load average",
            *failures]))
        for key, _, _ in ROWS:
            for system_name, median in zip(("dcmirror", "kafka"), figures.medians(f"{total}:{key}"), strict=True):
                saved.setdefault(system_name, {}).setdefault(str(total), {})[key] = median
        figures_file.parent.mkdir(parents=True, exist_ok=True)
        figures_file.write_text(json.dumps({"kafka_version": KAFKA_VERSION, "records": records, "rounds": rounds,
                                            "brokers": brokers, "medians": saved}, indent=1))
