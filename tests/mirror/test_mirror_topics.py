"""Mirror topics (issue 31): a flow with `mirror_topics = true` copies every source partition's
record batches into the target partition at the same offsets, byte for byte but for the
partitionLeaderEpoch field (bytes 12-15, outside the CRC: the target's own epoch), on every
replica of the target; read_committed and read_uncommitted consumers get the same records at
the same offsets from both; the copy refuses producers until it is promoted.

Real processes: a 1-broker source, a 3-broker target (RF 3: the target's followers copy the
mirror partitions, gaps included), one worker process killed -9 half way and started again,
librdkafka producers (idempotent, transactional with commits and aborts) and consumers.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from tests.cluster_helpers import admin
from tests.interop.common import segment_files
from tests.interop.test_mirror_append import leader_sees_promotion
from tests.mirror.lab import (
    Flow,
    MirrorLab,
    end_offsets,
    new_topic,
    read_topic,
    topic_config,
    wait_for,
)

pytestmark = [pytest.mark.timeout(420), pytest.mark.heavy]

FLOW = "east-to-dr"
_HEAD = struct.Struct(">qi")  # base offset, batch length


def disk_batches(data_dir: Path, topic: str, partition: int) -> dict[int, bytes]:
    """base offset -> the batch's bytes without partitionLeaderEpoch (bytes 12-15), from the
    partition's segment files."""
    out: dict[int, bytes] = {}
    for seg in segment_files(data_dir, topic, partition):
        data = seg.read_bytes()
        pos = 0
        while pos + 61 <= len(data):
            base, length = _HEAD.unpack_from(data, pos)
            if length <= 0:
                break
            out[base] = data[pos:pos + 12] + data[pos + 16:pos + 12 + length]
            pos += 12 + length
    return out


def produce_plain(bootstrap: str, topic: str, n: int, prefix: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "log_level": 2})
    for i in range(n):
        p.produce(topic, value=f"{prefix}-{i}".encode(), key=f"k{i % 50}".encode(), partition=i % 2,
                  headers=[("h", f"{i}".encode())])
    assert p.flush(60) == 0


def produce_transactions(bootstrap: str, topic: str, outcomes: str, prefix: str) -> None:
    """One transaction per letter of `outcomes` (c: commit, a: abort), 40 records each."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{prefix}", "log_level": 2})
    p.init_transactions(30)
    for t, outcome in enumerate(outcomes):
        p.begin_transaction()
        for i in range(40):
            p.produce(topic, value=f"{prefix}-t{t}-{outcome}-{i}".encode(), key=b"tx", partition=i % 2)
        if outcome == "c":
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)


def last_offset(raw: bytes) -> int:
    """The last offset of a batch as disk_batches keeps it (lastOffsetDelta: bytes 23-26 of
    the batch, 19-22 once bytes 12-15 are gone)."""
    base, _ = _HEAD.unpack_from(raw, 0)
    (delta,) = struct.unpack_from(">i", raw, 19)
    return int(base) + delta


def assert_same_batches(lab: MirrorLab, topic: str, partitions: int, log_starts: dict[int, int]) -> int:
    """Every target replica holds the source's batches from the one holding the source's log
    start on, byte for byte but bytes 12-15, at the same offsets; returns the batches compared."""
    (source_broker,) = lab["east"].brokers.values()
    compared = 0
    for p in range(partitions):
        source = disk_batches(source_broker.data_dir, topic, p)
        expected = {base: raw for base, raw in source.items() if last_offset(raw) >= log_starts[p]}
        for node, broker in lab["dr"].brokers.items():
            copy = disk_batches(broker.data_dir, topic, p)
            assert copy, f"dr node {node}: nothing of {topic}-{p} on disk"
            assert sorted(copy) == sorted(expected), \
                f"dr node {node} {topic}-{p}: batches at {sorted(copy)[:5]}..., source {sorted(expected)[:5]}..."
            different = [base for base in expected if copy[base] != expected[base]]
            assert not different, f"dr node {node} {topic}-{p}: batches at {different[:5]} differ from the source's"
            compared += len(copy)
    return compared


def test_mirror_topics_copy_batches_at_their_offsets_through_a_worker_kill(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    lab = mirror_lab({"east": 1, "dr": 3})
    east, dr = lab.bootstrap("east"), lab.bootstrap("dr")
    new_topic(east, "orders", 2, config={"retention.ms": "604800000", "cleanup.policy": "delete"})
    produce_plain(east, "orders", 3000, "a")
    produce_transactions(east, "orders", "cac", "one")
    # The source's log start moves (DeleteRecords): the copy starts at the batch holding it.
    client = admin(east)
    from confluent_kafka import TopicPartition as TP
    done = client.delete_records([TP("orders", 1, 700)])
    for f in done.values():
        f.result(timeout=30)

    lab.write_topology([Flow("east", "dr", "orders", rename="{topic}", mirror_topics=True,
                             config={"topic.refresh.ms": "1000"})], replication_factor=3)
    lab.start_worker(FLOW, 0)
    wait_for(lambda: sum(end_offsets(dr, "orders").values()) >= 1000, 120, "the copy under way",
             interval_s=0.2, on_timeout=lab.mirror_log_tail)
    lab.kill_worker(FLOW, 0)
    lab.workers[FLOW, 0].wait(30)
    produce_plain(east, "orders", 2000, "b")
    produce_transactions(east, "orders", "aacc", "two")
    lab.start_worker(FLOW, 0)

    ends = end_offsets(east, "orders")
    wait_for(lambda: end_offsets(dr, "orders") == ends, 180, f"dr orders at the source's ends {ends}",
             interval_s=0.5, on_timeout=lab.mirror_log_tail)
    # The target's followers have it too (RF 3): compared on every replica's disk.
    wait_for(lambda: _replicas_complete(lab, "orders", ends), 60, "every dr replica at the ends", interval_s=0.5)
    compared = assert_same_batches(lab, "orders", 2, low_watermarks(east, "orders", 2))
    print(f"compared {compared} batches on 3 replicas; ends {ends}")

    for isolation in ("read_committed", "read_uncommitted"):
        source, copy = read_topic(east, "orders", isolation=isolation), read_topic(dr, "orders", isolation=isolation)
        assert copy == source, f"{isolation}: the copy answers differently"
    committed = read_topic(dr, "orders", isolation="read_committed")
    values = [r.value for rows in committed.values() for r in rows]
    assert not any(v is not None and b"-a-" in v for v in values), "aborted records read committed from the copy"
    assert sum(1 for v in values if v is not None and b"-c-" in v) == 4 * 40

    # Mirror topics refuse producers, with an error that names them read-only.
    errors: list[KafkaError] = []
    p = Producer({"bootstrap.servers": dr, "log_level": 2, "message.send.max.retries": 0})
    p.produce("orders", b"not allowed", partition=0, on_delivery=lambda err, _m: errors.append(err))
    p.flush(30)
    assert errors and errors[0] is not None and errors[0].code() == KafkaError.TOPIC_EXCEPTION, errors
    assert topic_config(dr, "orders")["mirror.source"].value == "east:orders"

    # Promoted (the marker removed), the topic takes writes after the copied offsets.
    lab.kill_worker(FLOW, 0)
    resource = ConfigResource(ConfigResource.Type.TOPIC, "orders", incremental_configs=[
        ConfigEntry("mirror.source", None, incremental_operation=AlterConfigOpType.DELETE)])
    client = admin(dr)
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    # Answered once the controller committed it; the partition's leader (another broker,
    # maybe) takes producers once it applied it.
    wait_for(lambda: trio.run(leader_sees_promotion, dr, "orders"), 30, "the leader applying the promotion",
             interval_s=0.1)
    delivered: list[tuple[int, int]] = []
    q = Producer({"bootstrap.servers": dr, "enable.idempotence": True, "log_level": 2})
    q.produce("orders", b"after promotion", partition=0,
              on_delivery=lambda err, m: delivered.append((m.partition(), m.offset())) if err is None else None)
    assert q.flush(30) == 0
    assert delivered == [(0, ends[0])]


def low_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "lab-low", "log_level": 2})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0] for p in range(partitions)}
    finally:
        c.close()


def _replicas_complete(lab: MirrorLab, topic: str, ends: dict[int, int]) -> bool:
    for broker in lab["dr"].brokers.values():
        for p, end in ends.items():
            batches = disk_batches(broker.data_dir, topic, p)
            if not batches:
                return False
            last = max(batches)
            # last offset delta at bytes 23..27 of the batch (12 + 4 epoch bytes removed: 19..23)
            (delta,) = struct.unpack_from(">i", batches[last], 19)
            if last + delta + 1 < end:
                return False
    return True
