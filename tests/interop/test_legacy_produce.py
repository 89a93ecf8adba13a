"""Produce v0-2 (message sets of magic 0 and 1) up-converted to record batches v2.

kafka-python pinned to old broker versions (`api_version` 0.8.2, 0.9, 0.10.1) writes
magic 0 and 1 messages, plain and gzip / snappy / lz4 compressed (magic 0 LZ4 with the
pre-0.10 header checksum, KAFKA-3160); librdkafka reads them back exactly; the log on disk
holds only magic 2 batches. Over a raw socket: a bad message set is refused for its
partition only (CORRUPT_MESSAGE), KIP-467's rules hold for converted records, acks=0 gets
no answer and is written all the same.
"""

from __future__ import annotations

import socket
import struct
import time
import zlib
from typing import Any

from tests.harness import BrokerProcess
from tests.interop.common import read_disk_batches
from tests.interop.test_groups import create_topic

OLD_VERSIONS = [((0, 8, 2), 0), ((0, 9), 0), ((0, 10, 1), 1)]  # (kafka-python api_version, magic)
CODECS = [None, "gzip", "snappy", "lz4"]


def message(magic: int, key: bytes | None, value: bytes | None, timestamp: int = 0) -> bytes:
    """One uncompressed message with offset and size, from the protocol guide."""
    def field(b: bytes | None) -> bytes:
        return struct.pack(">i", -1) if b is None else struct.pack(">i", len(b)) + b

    body = struct.pack(">bb", magic, 0) + (struct.pack(">q", timestamp) if magic == 1 else b"") + field(key) + \
        field(value)
    msg = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(msg)) + msg


def legacy_produce(sock: socket.socket, version: int, correlation_id: int, acks: int,
                   topics: list[tuple[str, list[tuple[int, bytes]]]]) -> bytes | None:
    """Send a Produce v0-2 request; its answer body (after the correlation id), or None
    when none comes within a second (acks=0)."""
    body = struct.pack(">hi", acks, 5000) + struct.pack(">i", len(topics))
    for name, parts in topics:
        body += struct.pack(">h", len(name)) + name.encode() + struct.pack(">i", len(parts))
        for index, message_set in parts:
            body += struct.pack(">ii", index, len(message_set)) + message_set
    frame = struct.pack(">hhih", 0, version, correlation_id, 3) + b"raw" + body
    sock.sendall(struct.pack(">i", len(frame)) + frame)
    sock.settimeout(1.0 if acks == 0 else 20.0)
    try:
        head = sock.recv(4, socket.MSG_WAITALL)
    except TimeoutError:
        return None
    (size,) = struct.unpack(">i", head)
    data = sock.recv(size, socket.MSG_WAITALL)
    assert struct.unpack_from(">i", data)[0] == correlation_id
    return data[4:]


def parse_v0_answer(data: bytes) -> list[tuple[str, int, int, int]]:
    """(topic, partition, error code, base offset) of a Produce v0 answer."""
    out = []
    pos = 0
    (n_topics,) = struct.unpack_from(">i", data, pos)
    pos += 4
    for _ in range(n_topics):
        (n,) = struct.unpack_from(">h", data, pos)
        name = data[pos + 2 : pos + 2 + n].decode()
        pos += 2 + n
        (n_parts,) = struct.unpack_from(">i", data, pos)
        pos += 4
        for _ in range(n_parts):
            index, code, base = struct.unpack_from(">ihq", data, pos)
            out.append((name, index, code, base))
            pos += 14
    assert pos == len(data), "bytes after a v0 answer"
    return out


def read_all(bootstrap: str, topic: str, partition: int, count: int) -> list[Any]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "legacy-reader", "enable.auto.commit": False})
    got: list[Any] = []
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                assert not m.error(), m.error()
                got.append(m)
    finally:
        c.close()
    return got


def test_old_kafka_python_producers_are_up_converted(broker_factory: Any) -> None:
    from kafka import KafkaProducer

    b: BrokerProcess = broker_factory()
    topic = "old-formats"
    create_topic(b.bootstrap, topic, 1)
    sent: list[tuple[int, bytes, bytes, int]] = []  # offset, key, value, timestamp (-1: none)
    for api_version, magic in OLD_VERSIONS:
        for codec in CODECS:
            producer = KafkaProducer(bootstrap_servers=b.bootstrap, api_version=api_version, compression_type=codec,
                                     acks="all", retries=0, request_timeout_ms=10_000)
            try:
                batch = []
                for i in range(5):
                    key, value = f"k{i}".encode(), f"{api_version}-{codec}-{i}".encode()
                    ts = 1_700_000_000_000 + len(sent) + i
                    batch.append((producer.send(topic, key=key, value=value, timestamp_ms=ts), key, value,
                                  ts if magic == 1 else -1))
                producer.flush(15)
                for future, key, value, ts in batch:
                    sent.append((future.get(10).offset, key, value, ts))
            finally:
                producer.close(5)
    assert [o for o, _, _, _ in sent] == list(range(60)), "offsets in send order, no gaps"
    got = read_all(b.bootstrap, topic, 0, 60)
    assert [(m.offset(), m.key(), m.value(), m.timestamp()[1]) for m in got] == sent
    batches = read_disk_batches(b.data_dir, topic, 0)  # asserts magic 2 for every batch
    assert sum(x.records_count for x in batches) == 60
    assert all(x.producer_id == -1 for x in batches)


def test_raw_legacy_produce_answers_per_partition(broker_factory: Any) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    b: BrokerProcess = broker_factory()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic("raw-old", 2, 1), NewTopic("raw-compacted", 1, 1,
                                                                config={"cleanup.policy": "compact"})])["raw-old"].result(15)
    time.sleep(1.0)
    good = message(0, b"a", b"1") + message(0, b"b", b"2")
    bad_crc = bytearray(message(0, b"c", b"3"))
    bad_crc[-1] ^= 0xFF
    with socket.create_connection(("127.0.0.1", b.port)) as sock:
        answer = legacy_produce(sock, 0, 1, -1, [("raw-old", [(0, good), (1, bytes(bad_crc))])])
        assert answer is not None
        assert parse_v0_answer(answer) == [("raw-old", 0, 0, 0), ("raw-old", 1, 2, -1)]  # CORRUPT_MESSAGE
        # Truncated set and a magic-2 record where magic 0/1 belongs: refused the same way.
        answer = legacy_produce(sock, 0, 2, 1, [("raw-old", [(1, good[:-3]), (0, message(0, b"d", b"4"))])])
        assert answer is not None and parse_v0_answer(answer) == [("raw-old", 1, 2, -1), ("raw-old", 0, 0, 2)]
        # KIP-467 holds for converted records: a compacted topic refuses a keyless one.
        answer = legacy_produce(sock, 0, 3, -1, [("raw-compacted", [(0, message(1, None, b"v", 1))])])
        assert answer is not None and parse_v0_answer(answer) == [("raw-compacted", 0, 87, -1)]  # INVALID_RECORD
        # acks=0: no answer, written all the same (the next record lands after it).
        assert legacy_produce(sock, 1, 4, 0, [("raw-old", [(0, message(1, b"e", b"5", 7))])]) is None
        answer = legacy_produce(sock, 2, 5, 1, [("raw-old", [(0, message(1, b"f", b"6", 8))])])
        assert answer is not None
        index, code, base, log_append_time = struct.unpack_from(">ihqq", answer, 4 + 2 + len("raw-old") + 4)
        assert (index, code, base, log_append_time) == (0, 0, 4, -1)
        assert struct.unpack_from(">i", answer, len(answer) - 4)[0] == 0  # throttle_time (v1+)
    got = read_all(b.bootstrap, "raw-old", 0, 5)
    assert [(m.offset(), m.key(), m.value()) for m in got] == [
        (0, b"a", b"1"), (1, b"b", b"2"), (2, b"d", b"4"), (3, b"e", b"5"), (4, b"f", b"6")]
    assert [m.timestamp()[1] for m in got][3:] == [7, 8]
