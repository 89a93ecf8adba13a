"""Durability across broker crashes, with real broker processes and confluent-kafka clients.

- kill -9 while a producer (acks=1) is producing: every acknowledged record is there
  exactly once after the restart.
- kill -9 with >= 1 GB on disk: recovery scans only what lies past the recovery point
  (at most one 64 MiB segment), not the whole log.
- torn tails (cut, flipped byte, garbage) after kill -9 or after a clean stop are
  truncated to the last intact batch; consumers see exactly the intact records.

kill -9 does not lose the page cache, so everything the broker wrote (and therefore
everything it acknowledged) is on "disk" afterwards; the tests damage files by hand to
model what a machine crash could leave.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cluster.protocol.record_batch import BatchHeader, iter_headers
from tests.harness import BrokerProcess

RECOVERED = re.compile(
    r"recovered (?P<name>\S+) from recovery point (?P<rp>\d+): scanned (?P<bytes>\d+) bytes in "
    r"(?P<segments>\d+) segment\(s\), (?P<batches>\d+) batches; truncated (?P<truncated>\d+) bytes, "
    r"deleted (?P<deleted>\d+) segment\(s\)(?P<reasons>.*?); log end offset (?P<leo>\d+)"
)
SUMMARY = re.compile(r"recovery after unclean shutdown: scanned (?P<bytes>\d+) bytes across (?P<logs>\d+) log\(s\)")
STARTUP = re.compile(r"startup took (?P<s>[0-9.]+) s")


# ---------------------------------------------------------------- helpers


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})
    fut = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config)],
                              operation_timeout=10, request_timeout=15)
    fut[topic].result(timeout=20)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        t = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions and all(
            p.leader >= 0 for p in t.partitions.values()
        ):
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} has no leaders after 15 s")


def consumer(bootstrap: str) -> Consumer:
    return Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "durability-assign-only",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": False,
        "socket.timeout.ms": 10000,
        "fetch.wait.max.ms": 100,
    })


def watermarks(bootstrap: str, topic: str, partition: int = 0, timeout_s: float = 15.0) -> tuple[int, int]:
    c = consumer(bootstrap)
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s, cached=False)
        return low, high
    finally:
        c.close()


def consume_all(bootstrap: str, topic: str, ends: dict[int, int], timeout_s: float = 60.0,
                settle_s: float = 1.0) -> dict[int, list[tuple[int, bytes]]]:
    """Every (offset, value) of each partition from the beginning up to ends[p] (and any
    extra that shows up within settle_s after that). Raises on consumer errors/timeouts."""
    c = consumer(bootstrap)
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in ends}
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        nxt = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + timeout_s

        def drain(timeout: float) -> None:
            for msg in c.consume(num_messages=10000, timeout=timeout):
                if msg.error():
                    raise AssertionError(f"consumer error: {msg.error()!r}")
                got[msg.partition()].append((msg.offset(), msg.value()))
                nxt[msg.partition()] = msg.offset() + 1

        while any(nxt[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise AssertionError(f"consumed only up to {nxt} of {ends} within {timeout_s} s")
            drain(0.5)
        settle = time.monotonic() + settle_s
        while time.monotonic() < settle:
            drain(0.2)
        return got
    finally:
        c.close()


def recovery_lines(text: str, topic: str) -> list[dict[str, Any]]:
    """Parsed per-partition recovery lines of `topic` (other logs, e.g. internal topics,
    are left out)."""
    out = []
    for m in RECOVERED.finditer(text):
        if m["name"].rsplit("-", 1)[0] != topic:
            continue
        d: dict[str, Any] = {k: int(v) for k, v in m.groupdict().items() if k not in ("name", "reasons")}
        d["name"] = m["name"]
        d["reasons"] = m["reasons"]
        out.append(d)
    return out


def part_dir(broker: BrokerProcess, topic: str, partition: int = 0) -> Path:
    return broker.data_dir / f"{topic}-{partition}"


def log_files(broker: BrokerProcess, topic: str, partition: int = 0) -> list[Path]:
    d = part_dir(broker, topic, partition)
    return sorted(p for p in d.iterdir() if p.suffix == ".log" and p.stem.isdigit())


def disk_batches(path: Path) -> list[tuple[int, BatchHeader]]:
    return list(iter_headers(path.read_bytes()))


def checkpointed_recovery_point(broker: BrokerProcess, topic: str, partition: int = 0) -> int | None:
    path = broker.data_dir / "recovery-point-offset-checkpoint"
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines[2:]:
        t, p, off = line.rsplit(" ", 2)
        if t == topic and int(p) == partition:
            return int(off)
    return None


def wait_for(pred: Any, timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def produce_exact(bootstrap: str, topic: str, values: list[bytes], chunk: int) -> list[int]:
    """Produce values to partition 0, `chunk` per flush (so each chunk is one batch);
    returns the offset of every value. Every record must be acknowledged."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 1000, "retries": 0,
                  "message.timeout.ms": 20000, "batch.num.messages": chunk})
    offsets: list[int | None] = [None] * len(values)
    errors: list[Any] = []

    def cb_for(i: int) -> Any:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                offsets[i] = msg.offset()
        return cb

    for start in range(0, len(values), chunk):
        for i in range(start, min(start + chunk, len(values))):
            p.produce(topic, values[i], partition=0, on_delivery=cb_for(i))
        assert p.flush(20) == 0, "flush timed out"
    assert not errors, errors[:3]
    assert None not in offsets
    return [o for o in offsets if o is not None]


# ---------------------------------------------------------------- a. kill -9 while producing


class SeqProducer(threading.Thread):
    """Produces values b"seq-<n>-..." round-robin over partitions until stopped; records
    (seq, partition, offset) of every acknowledged one.

    retries=0: without idempotence a retried batch that the broker had appended before the
    crash would legitimately be appended twice (and then acknowledged), so an acked record
    could appear twice. With no retries every record is sent at most once, so every acked
    record must appear exactly once.
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.partitions = partitions
        self.producer: Producer | None = Producer({
            "bootstrap.servers": bootstrap,
            "acks": 1,
            "retries": 0,
            "enable.idempotence": False,
            "linger.ms": 5,
            "message.timeout.ms": 30000,
            "socket.timeout.ms": 5000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000,
        })
        self.stop_event = threading.Event()
        self.acked: list[tuple[int, int, int]] = []
        self.failed = 0
        self.sent = 0
        self.remaining_after_flush = -1
        self.exc: BaseException | None = None

    def _cb(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed += 1
            return
        seq = int(msg.value().split(b"-", 2)[1])
        self.acked.append((seq, msg.partition(), msg.offset()))

    def run(self) -> None:
        producer = self.producer
        assert producer is not None
        try:
            seq = 0
            while not self.stop_event.is_set():
                for _ in range(200):
                    value = f"seq-{seq:09d}-".encode() + b"d" * (40 + seq % 80)
                    try:
                        producer.produce(self.topic, value, partition=seq % self.partitions,
                                         on_delivery=self._cb)
                    except BufferError:
                        producer.poll(0.05)
                        continue
                    seq += 1
                self.sent = seq
                producer.poll(0.01)  # ~20k records/s at most
            self.remaining_after_flush = producer.flush(40)
        except BaseException as exc:  # surfaced by the test
            self.exc = exc


@pytest.mark.timeout(240)
def test_kill9_during_production_keeps_every_acked_record_exactly_once(tmp_path: Path) -> None:
    topic, partitions = "kill9", 3
    broker = BrokerProcess(tmp_path / "broker").start()
    prod: SeqProducer | None = None
    try:
        # Small segments so that rolls (and recovery-point advances) happen mid-stream.
        create_topic(broker.bootstrap, topic, partitions, {"segment.bytes": str(256 * 1024)})
        prod = SeqProducer(broker.bootstrap, topic, partitions)
        prod.start()
        wait_for(lambda: len(prod.acked) >= 30000 or prod.exc, 60, "30000 acked records before the kill")
        log_before = len(broker.log_text())
        broker.kill9()
        acked_at_kill = len(prod.acked)
        time.sleep(1.0)  # the producer keeps producing into a dead broker
        broker.start()
        wait_for(lambda: len(prod.acked) >= acked_at_kill + 20000 or prod.exc, 60,
                 "20000 more acked records after the restart")
        prod.stop_event.set()
        prod.join(60)
        assert not prod.is_alive(), "producer thread did not finish"
        assert prod.exc is None, prod.exc
        assert prod.remaining_after_flush == 0

        tail = broker.log_text()[log_before:]
        lines = recovery_lines(tail, topic)
        assert sorted(line["name"] for line in lines) == [f"{topic}-{p}" for p in range(partitions)], tail[-3000:]
        assert SUMMARY.search(tail), tail[-3000:]

        ends = {p: watermarks(broker.bootstrap, topic, p)[1] for p in range(partitions)}
        got = consume_all(broker.bootstrap, topic, ends)
        by_pos: dict[tuple[int, int], bytes] = {}
        seq_count: dict[int, int] = {}
        for p, recs in got.items():
            assert [o for o, _ in recs] == list(range(ends[p])), f"partition {p}: offsets not 0..{ends[p] - 1}"
            for o, v in recs:
                by_pos[(p, o)] = v
                s = int(v.split(b"-", 2)[1])
                seq_count[s] = seq_count.get(s, 0) + 1

        acked = prod.acked
        assert len({s for s, _, _ in acked}) == len(acked)
        missing = [(s, p, o) for s, p, o in acked if seq_count.get(s, 0) == 0]
        duplicated = [(s, p, o) for s, p, o in acked if seq_count.get(s, 0) > 1]
        misplaced = [(s, p, o) for s, p, o in acked
                     if not by_pos.get((p, o), b"").startswith(f"seq-{s:09d}-".encode())]
        assert not missing, f"{len(missing)} acked records missing, first {missing[:5]}"
        assert not duplicated, f"{len(duplicated)} acked records duplicated, first {duplicated[:5]}"
        assert not misplaced, f"{len(misplaced)} acked records not at their acked offset, first {misplaced[:5]}"
        acked_seqs = {s for s, _, _ in acked}
        unacked_present = sum(1 for s in seq_count if s not in acked_seqs)
        print(f"\nkill -9 test: sent {prod.sent}, acked {len(acked)} ({acked_at_kill} before the kill), "
              f"failed {prod.failed}, unacked but present {unacked_present}, "
              f"log end offsets {ends}")
    finally:
        if prod is not None:
            if prod.is_alive():
                prod.stop_event.set()
                prod.join(60)
            prod.producer = None  # destroy the client now, not when the frame is collected
        broker.stop()


# ---------------------------------------------------------------- b. restart with >= 1 GB


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_restart_after_kill9_with_1gb_scans_at_most_one_segment(tmp_path: Path) -> None:
    total_bytes = int(os.environ.get("DCMIRROR_RECOVERY_TEST_BYTES", str(1_050_000_000)))
    record_bytes = 1000
    segment_bytes = 64 * 1024 * 1024
    n = total_bytes // record_bytes
    topic = "big"
    broker = BrokerProcess(tmp_path / "big-broker").start()
    try:
        create_topic(broker.bootstrap, topic, 1, {"segment.bytes": str(segment_bytes)})
        producer = Producer({
            "bootstrap.servers": broker.bootstrap,
            "acks": 1,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "compression.type": "none",
            "queue.buffering.max.kbytes": 1_048_576,
            "queue.buffering.max.messages": 2_000_000,
            "message.timeout.ms": 120_000,
        })
        acked = [0]
        errors: list[Any] = []

        def cb(err: Any, msg: Any) -> None:
            if err is None:
                acked[0] += 1
            else:
                errors.append(err)

        pad = b"." * (record_bytes - 12)
        t0 = time.monotonic()
        deadline = t0 + 150
        for i in range(n):
            value = b"%012d" % i + pad
            while True:
                try:
                    producer.produce(topic, value, partition=0, on_delivery=cb)
                    break
                except BufferError:
                    assert time.monotonic() < deadline, "producer queue stayed full"
                    producer.poll(0.05)
            if i % 20000 == 0:
                producer.poll(0)
        assert producer.flush(max(1.0, deadline - time.monotonic())) == 0, "produce did not finish in time"
        produce_s = time.monotonic() - t0
        del producer  # disconnect before the kill
        assert not errors, errors[:3]
        assert acked[0] == n

        segments = log_files(broker, topic)
        assert len(segments) >= 2, "no segment roll happened"
        active = segments[-1]
        active_base = int(active.stem)
        total_on_disk = sum(p.stat().st_size for p in segments)
        # The roll asked the flush loop to fsync the old segments; it then checkpoints the
        # recovery point at the active segment's base (within log.flush.scheduler.interval.ms).
        wait_for(lambda: checkpointed_recovery_point(broker, topic) == active_base, 10,
                 f"recovery point checkpoint to reach the active segment base {active_base}")
        time.sleep(0.5)
        active_size = active.stat().st_size
        assert [p.name for p in log_files(broker, topic)] == [p.name for p in segments]

        log_before = len(broker.log_text())
        broker.kill9()
        t1 = time.monotonic()
        broker.start(timeout_s=120)
        restart_s = time.monotonic() - t1
        tail = broker.log_text()[log_before:]
        lines = recovery_lines(tail, topic)
        assert len(lines) == 1, tail[-3000:]
        rec = lines[0]
        summary = SUMMARY.search(tail)
        assert summary, tail[-3000:]
        startup = STARTUP.search(tail)
        scanned = rec["bytes"]
        print(f"\n1 GB recovery: produced {n} x {record_bytes} B = {total_on_disk} B on disk in "
              f"{len(segments)} segments in {produce_s:.1f} s; kill -9 restart to listening {restart_s:.2f} s "
              f"(broker 'startup took' {startup['s'] if startup else '?'} s); recovery point {rec['rp']}, "
              f"scanned {scanned} B in {rec['segments']} segment(s), {rec['batches']} batches; "
              f"summary scanned {summary['bytes']} B across {summary['logs']} log(s)")

        assert rec["name"] == f"{topic}-0"
        assert rec["rp"] == active_base
        assert scanned == active_size, "recovery scanned more (or less) than the active segment"
        assert scanned <= segment_bytes + 1_100_000  # one segment plus at most one batch
        assert scanned * 4 < total_on_disk
        assert rec["segments"] == 1
        assert (rec["truncated"], rec["deleted"], rec["leo"]) == (0, 0, n)
        # Other logs (internal topics) hold next to nothing.
        assert scanned <= int(summary["bytes"]) <= scanned + 1_000_000
        assert watermarks(broker.bootstrap, topic) == (0, n)

        # The newest records read back intact.
        c = consumer(broker.bootstrap)
        try:
            c.assign([TopicPartition(topic, 0, n - 100)])
            seen: list[tuple[int, bytes]] = []
            stop = time.monotonic() + 20
            while len(seen) < 100 and time.monotonic() < stop:
                for m in c.consume(100, timeout=0.5):
                    assert not m.error(), m.error()
                    seen.append((m.offset(), m.value()))
        finally:
            c.close()
        assert [o for o, _ in seen] == list(range(n - 100, n))
        assert all(v == b"%012d" % o + pad for o, v in seen)

        # A clean restart scans nothing and logs no recovery.
        log_before = len(broker.log_text())
        broker.stop()
        t2 = time.monotonic()
        broker.start(timeout_s=120)
        clean_s = time.monotonic() - t2
        tail = broker.log_text()[log_before:]
        assert "stopped cleanly" in tail
        assert not recovery_lines(tail, topic) and not SUMMARY.search(tail), tail[-3000:]
        assert watermarks(broker.bootstrap, topic) == (0, n)
        print(f"1 GB clean restart to listening {clean_s:.2f} s")
    finally:
        broker.stop()
        shutil.rmtree(broker.data_dir, ignore_errors=True)


# ---------------------------------------------------------------- c. torn tails


def torn_values(n: int) -> list[bytes]:
    return [f"torn-{i:05d}-".encode() + b"t" * (100 + i % 50) for i in range(n)]


def damage(path: Path, how: str) -> tuple[int, int]:
    """Damage the active segment; returns (expected log end offset, expected truncated bytes)."""
    batches = disk_batches(path)
    data = bytearray(path.read_bytes())
    assert len(batches) >= 3 and batches[-1][0] + batches[-1][1].size_bytes == len(data)
    (prev_pos, prev), (last_pos, last) = batches[-2], batches[-1]
    if how == "cut":
        del data[-5:]
        result = (last.base_offset, len(data) - last_pos)
    elif how == "flip":
        data[last_pos + last.size_bytes - 30] ^= 0x20
        result = (last.base_offset, len(data) - last_pos)
    elif how == "flip_previous_and_cut":
        data[prev_pos + 70] ^= 0x01
        del data[-3:]
        result = (prev.base_offset, len(data) - prev_pos)
    elif how == "garbage":
        data += os.urandom(77)
        result = (last.next_offset, 77)
    else:
        raise AssertionError(how)
    path.write_bytes(bytes(data))
    return result


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("stop", "how"),
    [
        ("kill9", "cut"),
        ("kill9", "flip"),
        ("kill9", "flip_previous_and_cut"),
        ("kill9", "garbage"),
        # After a clean stop only the active segment's size is compared with what the
        # shutdown recorded (as Kafka trusts a cleanly closed log), so only damage that
        # changes the size is detected there; see test_clean_stop_does_not_rescan_same_size_change.
        ("clean", "cut"),
        ("clean", "flip_previous_and_cut"),
        ("clean", "garbage"),
    ],
)
def test_torn_tail_is_truncated_to_last_intact_batch(tmp_path: Path, how: str, stop: str) -> None:
    topic = "torn"
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        create_topic(broker.bootstrap, topic, 1, {"segment.bytes": "20000"})
        values = torn_values(300)
        offsets = produce_exact(broker.bootstrap, topic, values, chunk=10)
        assert offsets == list(range(300))
        segments = log_files(broker, topic)
        assert len(segments) >= 3
        if stop == "kill9":
            broker.kill9()
        else:
            assert broker.stop() == 0
            assert (broker.data_dir / ".dcmirror-clean-shutdown").exists()
        active = log_files(broker, topic)[-1]
        assert active == segments[-1]
        expect_end, expect_truncated = damage(active, how)
        intact_size = active.stat().st_size - expect_truncated

        log_before = len(broker.log_text())
        broker.start()
        tail = broker.log_text()[log_before:]
        lines = recovery_lines(tail, topic)
        assert len(lines) == 1, tail[-3000:]
        rec = lines[0]
        assert rec["name"] == f"{topic}-0"
        assert rec["truncated"] == expect_truncated
        assert rec["deleted"] == 0
        assert rec["leo"] == expect_end
        assert f"segment {int(active.stem)}:" in rec["reasons"], rec["reasons"]
        if stop == "clean":
            assert "active segment changed after clean shutdown" in rec["reasons"]
            assert not SUMMARY.search(tail)  # the broker as a whole shut down cleanly
            assert rec["segments"] == 1  # only the changed active segment is validated
        else:
            assert SUMMARY.search(tail)
        assert active.stat().st_size == intact_size

        assert watermarks(broker.bootstrap, topic) == (0, expect_end)
        got = consume_all(broker.bootstrap, topic, {0: expect_end})[0]
        assert got == list(enumerate(values[:expect_end]))
        # Producing goes on right after the last intact batch.
        assert produce_exact(broker.bootstrap, topic, [b"after"], chunk=1) == [expect_end]
        assert watermarks(broker.bootstrap, topic) == (0, expect_end + 1)
    finally:
        broker.stop()


@pytest.mark.timeout(120)
def test_clean_restart_logs_no_recovery_and_keeps_everything(tmp_path: Path) -> None:
    topic = "clean"
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        create_topic(broker.bootstrap, topic, 1, {"segment.bytes": "20000"})
        values = torn_values(300)
        assert produce_exact(broker.bootstrap, topic, values, chunk=10) == list(range(300))
        sizes = {p.name: p.stat().st_size for p in log_files(broker, topic)}
        log_before = len(broker.log_text())
        broker.stop()
        broker.start()
        tail = broker.log_text()[log_before:]
        assert "stopped cleanly" in tail
        assert not recovery_lines(tail, topic) and not SUMMARY.search(tail), tail[-3000:]
        assert {p.name: p.stat().st_size for p in log_files(broker, topic)} == sizes
        assert watermarks(broker.bootstrap, topic) == (0, 300)
        assert consume_all(broker.bootstrap, topic, {0: 300})[0] == list(enumerate(values))
    finally:
        broker.stop()


@pytest.mark.timeout(120)
def test_clean_stop_does_not_rescan_same_size_change(tmp_path: Path) -> None:
    """Documents the clean-shutdown contract: a byte flipped in place while the broker is
    stopped (size unchanged) is not looked for; the log is trusted as it was closed."""
    topic = "trusted"
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        create_topic(broker.bootstrap, topic, 1, {"segment.bytes": "20000"})
        produce_exact(broker.bootstrap, topic, torn_values(300), chunk=10)
        broker.stop()
        active = log_files(broker, topic)[-1]
        size = active.stat().st_size
        damage(active, "flip")
        log_before = len(broker.log_text())
        broker.start()
        tail = broker.log_text()[log_before:]
        assert not recovery_lines(tail, topic), tail[-3000:]
        assert active.stat().st_size == size
        assert watermarks(broker.bootstrap, topic) == (0, 300)
    finally:
        broker.stop()
