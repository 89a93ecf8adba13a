"""Whatever the source accepts is copied, with real broker and worker processes:

- `big` (the default max.message.bytes, 1,048,588): the largest record the source accepts
  (a value one byte larger is refused there), and a 3 MB record the source took lz4-
  compressed into a small batch (the flow writes it zstd-compressed, alone in its batch);
- `big-raised` (max.message.bytes 2,000,000): its largest record;
- `big`'s limit raised while the flow runs: its new largest record follows;
- `huge` (3,000,000) into an aggregate whose brokers read requests of at most 2,500,000
  bytes: its largest record cannot be written even compressed (random bytes): it is
  dead-lettered once (its coordinates in dcmirror.deadletter, the status, the counter,
  an ERROR) and the partition goes on behind it;
- behind every large record 100 small ones, all mirrored: no partition is blocked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from tests.cluster_helpers import admin
from tests.mirror.lab import (
    Flow,
    MirrorLab,
    compare,
    mirrored_count,
    new_topic,
    read_topic,
    topic_config,
    wait_for,
)

FLOW = "east-to-aggregate"
DEFAULT_LIMIT = 1_048_588
BATCH_HEADER_BYTES = 61


def _varint_bytes(n: int) -> int:
    zigzag, size = n << 1, 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def batch_bytes(value_bytes: int) -> int:
    """A one-record batch: its header, then the record (length, attributes, timestamp and
    offset deltas, key length, the 1-byte key, value length, value, header count)."""
    record = 1 + 1 + 1 + 1 + 1 + _varint_bytes(value_bytes) + value_bytes + 1
    return BATCH_HEADER_BYTES + _varint_bytes(record) + record


def largest_value(limit: int) -> int:
    """The largest value of a one-record batch the limit takes."""
    value = limit - BATCH_HEADER_BYTES
    while batch_bytes(value) > limit:
        value -= 1
    return value


def produce(bootstrap: str, topic: str, values: list[bytes], *, compression: str = "none") -> list[Any]:
    """Each value as one record (key b"k") into partition 0: delivery errors (None: written)."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 0,
                  "message.max.bytes": 8_000_000, "compression.type": compression, "log_level": 2})
    results: list[Any] = [None] * len(values)

    def delivered(i: int) -> Callable[[KafkaError | None, Any], None]:
        def cb(err: KafkaError | None, _msg: Any) -> None:
            results[i] = err
        return cb

    for i, v in enumerate(values):
        p.produce(topic, value=v, key=b"k", partition=0, on_delivery=delivered(i))
        p.flush(60)
    assert p.flush(60) == 0
    return results


def small(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def set_limit(bootstrap: str, topic: str, limit: int) -> None:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET)])
    client = admin(bootstrap)  # kept until the answers are in (a collected client fails them)
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


@pytest.mark.timeout(300)
def test_records_of_the_sources_largest_accepted_size_are_mirrored_and_nothing_waits_behind_them(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    lab = mirror_lab({"east": 1, "aggregate": 1}, cluster_config={"aggregate": {"socket.request.max.bytes": 2_500_000}})
    east, aggregate = lab.bootstrap("east"), lab.bootstrap("aggregate")
    new_topic(east, "big", 1)
    new_topic(east, "big-raised", 1, config={"max.message.bytes": "2000000"})
    new_topic(east, "huge", 1, config={"max.message.bytes": "3000000"})

    largest = os.urandom(largest_value(DEFAULT_LIMIT))
    refused = produce(east, "big", [largest + b"x"])
    assert refused[0] is not None and refused[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, \
        f"a value one byte larger than {len(largest)} was not refused by the source: {refused}"
    inflating = (b"pageview " * 400_000)[:3_000_000]  # lz4 takes it to a small batch
    assert produce(east, "big", [largest]) == [None]
    assert produce(east, "big", [inflating], compression="lz4") == [None]
    assert produce(east, "big", small("big", 100)) == [None] * 100
    raised = os.urandom(largest_value(2_000_000))
    assert produce(east, "big-raised", [raised] + small("raised", 100)) == [None] * 101
    too_large = os.urandom(largest_value(3_000_000))
    assert produce(east, "huge", [too_large] + small("huge", 100)) == [None] * 101

    # No topic refresh while the test runs: the grown limit is noticed by the record it lets in.
    lab.write_topology([Flow("east", "aggregate", "big.*|huge", config={"topic.refresh.ms": "600000"})])
    lab.start_worker(FLOW, 0)
    for topic, count in (("big", 102), ("big-raised", 101), ("huge", 100)):
        wait_for(lambda t=topic, c=count: mirrored_count(aggregate, f"east.{t}") == c, 90,
                 f"east.{topic} holds {count} records", interval_s=0.5, on_timeout=lab.mirror_log_tail)

    # The source's limit grows while the flow runs: the target follows, the new largest record too.
    set_limit(east, "big", 1_500_000)
    grown = os.urandom(largest_value(1_500_000))
    assert produce(east, "big", [grown] + small("grown", 10)) == [None] * 11
    wait_for(lambda: mirrored_count(aggregate, "east.big") == 113, 60, "east.big holds 113 records",
             interval_s=0.5, on_timeout=lab.mirror_log_tail)

    for topic in ("big", "big-raised"):
        outcome = compare(read_topic(east, topic), read_topic(aggregate, f"east.{topic}"), "east")
        outcome.assert_clean()
    source = read_topic(east, "huge")
    outcome = compare({0: source[0][1:]}, read_topic(aggregate, "east.huge"), "east")
    outcome.assert_clean()
    assert [len(r.value or b"") for r in read_topic(aggregate, "east.big")[0][:2]] == [len(largest), len(inflating)]

    configs = {t: int(topic_config(aggregate, f"east.{t}")["max.message.bytes"].value) for t in ("big", "big-raised")}
    assert 1_500_000 < configs["big"] <= 1_500_000 + 1024 and 2_000_000 < configs["big-raised"] <= 2_000_000 + 1024, \
        configs

    # The one record no target request can hold: said once, with its coordinates.
    dead = [r for rows in read_topic(aggregate, "dcmirror.deadletter").values() for r in rows]
    assert len(dead) == 1, dead
    entry = json.loads(dead[0].value or b"")
    assert (entry["topic"], entry["partition"], entry["offset"], entry["size_bytes"]) == \
        ("huge", 0, 0, len(too_large) + 1), entry
    assert lab.mirror_log().count("DEAD LETTER: east/huge-0 offset 0 ") == 1, lab.mirror_log_tail()
    wait_for(lambda: next(iter(lab.worker_status(FLOW).values()))["dead_letter_records"] == 1, 10,
             "the dead letter counted in the status")
