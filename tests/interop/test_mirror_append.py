"""MirrorAppend between two real clusters: a mirror topic holds its source's batches at the
same offsets, byte for byte but the partition leader epoch (bytes 12-15), on every replica.

The source (one broker) holds a topic written by a librdkafka transactional producer,
transactions committed and aborted around plain records, whose log start DeleteRecords
moved into a batch; and a compacted topic after the cleaner ran (whole batches gone,
batches with fewer records than their span). Raw read_uncommitted fetches from the source
go into mirror topics (`mirror.source`) of a three-broker target with replication factor 3,
whose followers copy the gapped partitions as any. Then: every replica's disk against the
source's, consumers of both isolation levels on both clusters, librdkafka refused on the
mirror topic, MirrorAppend refused on an ordinary topic and under another topic id, and
after promotion (mirror.source deleted) an idempotent producer continuing the offsets,
though the target gave it a producer id the source's transactional producer had too.
"""

from __future__ import annotations

import re
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio

from cluster.client.connection import BrokerConnection
from cluster.client.mirror_append import mirror_append
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from tests.harness import BrokerProcess, ClusterProcesses
from tests.interop.common import partition_dir, segment_files, wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

pytestmark = pytest.mark.timeout(300)

TXN, COMPACTED, ORDINARY = "orders", "profiles", "plain"


# ---------------------------------------------------------------- helpers


def disk_batches(data_dir: Path, topic: str) -> list[tuple[int, bytes]]:
    """(base offset, bytes) of every batch in partition 0's segment files."""
    out = []
    for seg in segment_files(data_dir, topic, 0):
        data = seg.read_bytes()
        pos = 0
        while pos + 61 <= len(data):
            base, length = struct.unpack_from(">qi", data, pos)
            if length <= 0:
                break
            out.append((base, data[pos : pos + 12 + length]))
            pos += 12 + length
    return out


def without_epoch(batch: bytes) -> bytes:
    return batch[:12] + batch[16:]


def epoch_of(batch: bytes) -> int:
    return int(struct.unpack_from(">i", batch, 12)[0])


def producer_id_of(batch: bytes) -> int:
    return int(struct.unpack_from(">q", batch, 43)[0])


def create_topic(bootstrap: str, topic: str, config: dict[str, str], rf: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, rf, config=config)], operation_timeout=20)[topic].result(30)


def read_records(bootstrap: str, topic: str, isolation: str, end: int) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of everything a consumer of `isolation` reads below `end` (the
    partition's last stable offset or high watermark: reading stops when it gets there)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                  "isolation.level": isolation, "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[int, bytes | None, bytes | None]] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF and m.offset() >= end:
                    return out
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                continue
            out.append((m.offset(), m.key(), m.value()))
    finally:
        c.close()
    raise AssertionError(f"{isolation} consumer of {topic} at {bootstrap} did not reach offset {end}")


def end_offsets(bootstrap: str, topic: str, isolation: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm", "isolation.level": isolation})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        c.close()


def produce(bootstrap: str, topic: str, value: bytes, **conf: Any) -> tuple[Any, int]:
    """(delivery error or None, offset) of one record."""
    p = Producer({"bootstrap.servers": bootstrap, "message.send.max.retries": 0, **conf})
    got: list[tuple[Any, int]] = []
    p.produce(topic, value=value, partition=0, on_delivery=lambda err, msg: got.append((err, msg.offset())))
    p.flush(30)
    assert got, "no delivery report"
    return got[0]


async def metadata(conn: BrokerConnection) -> Any:
    return await conn.request(ApiKey.METADATA, {"topics": None, "allow_auto_topic_creation": False})


async def mirror(source: str, target: str, topics: list[str]) -> dict[str, list[dict[str, Any]]]:
    """What a mirror worker does, by hand: from the target's log end (or the source's log
    start, when that is above), fetch raw batches at read_uncommitted and MirrorAppend
    them, until the target holds the source's high watermark. The answers, per topic."""
    s_host, s_port = source.split(":")
    src = await BrokerConnection(s_host, int(s_port)).connect()
    boot = await BrokerConnection(*_host_port(target.split(",")[0])).connect()
    answers: dict[str, list[dict[str, Any]]] = {t: [] for t in topics}
    try:
        meta = await metadata(boot)
        brokers = {b.node_id: (b.host, b.port) for b in meta.brokers}
        for topic in topics:
            info = next(t for t in meta.topics if t.name == topic)
            leader = await BrokerConnection(*brokers[info.partitions[0].leader_id]).connect()
            try:
                earliest = await src.request(ApiKey.LIST_OFFSETS, {
                    "replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
                        {"partition_index": 0, "current_leader_epoch": -1, "timestamp": -2}]}]})
                position, source_start, source_hw = 0, earliest.topics[0].partitions[0].offset, 1
                while position < source_hw:
                    fetched = await src.request(ApiKey.FETCH, {
                        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 4096, "isolation_level": 0,
                        "session_id": 0, "session_epoch": -1,
                        "topics": [{"topic": topic, "partitions": [{
                            "partition": 0, "fetch_offset": max(position, source_start), "current_leader_epoch": -1,
                            "log_start_offset": -1, "last_fetched_epoch": -1, "partition_max_bytes": 4096}]}]})
                    part = fetched.responses[0].partitions[0]
                    assert part.error_code == 0, part
                    source_start, source_hw = part.log_start_offset, part.high_watermark
                    assert part.records, f"{topic}: nothing fetched at {position}, below the source's end {source_hw}"
                    got = await mirror_append(leader, topic, str(info.topic_id), {0: bytes(part.records or b"")},
                                              30.0, log_start_offsets={0: source_start})
                    answer = got[0]
                    assert answer["error_code"] == 0, answer
                    answers[topic].append(answer)
                    position = answer["log_end_offset"]
            finally:
                await leader.aclose()
    finally:
        await src.aclose()
        await boot.aclose()
    return answers


async def leader_sees_promotion(bootstrap: str, topic: str) -> bool:
    """The partition's leader describes the topic without `mirror.source` (its metadata
    has the promotion, so it takes producers)."""
    boot = await BrokerConnection(*_host_port(bootstrap.split(",")[0])).connect()
    try:
        meta = await metadata(boot)
        brokers = {b.node_id: (b.host, b.port) for b in meta.brokers}
        info = next(t for t in meta.topics if t.name == topic)
    finally:
        await boot.aclose()
    leader = await BrokerConnection(*brokers[info.partitions[0].leader_id]).connect()
    try:
        described = await leader.request(ApiKey.DESCRIBE_CONFIGS, {
            "include_synonyms": False, "include_documentation": False,
            "resources": [{"resource_type": 2, "resource_name": topic, "configuration_keys": None}]})
        return "mirror.source" not in {c.name for c in described.results[0].configs}
    finally:
        await leader.aclose()


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.split(":")
    return host, int(port)


async def append_once(target: str, topic: str, topic_id: str | None, data: bytes) -> dict[str, Any]:
    boot = await BrokerConnection(*_host_port(target.split(",")[0])).connect()
    try:
        meta = await metadata(boot)
        brokers = {b.node_id: (b.host, b.port) for b in meta.brokers}
        info = next(t for t in meta.topics if t.name == topic)
        leader = await BrokerConnection(*brokers[info.partitions[0].leader_id]).connect()
        try:
            return (await mirror_append(leader, topic, topic_id or str(info.topic_id), {0: data}, 10.0))[0]
        finally:
            await leader.aclose()
    finally:
        await boot.aclose()


# ---------------------------------------------------------------- the test


def test_mirror_topics_hold_the_sources_batches_at_the_same_offsets(tmp_path: Path) -> None:
    source = BrokerProcess(tmp_path / "east", **{"log.cleaner.backoff.ms": 300}).start()
    target = ClusterProcesses(tmp_path / "dr", 3, name="dr").start()
    try:
        _check_mirror(source, target)
    finally:
        source.stop()
        target.stop()


def _check_mirror(source: BrokerProcess, target: ClusterProcesses) -> None:
    east = source.bootstrap
    create_topic(east, TXN, {}, 1)
    create_topic(east, COMPACTED, {"cleanup.policy": "compact", "segment.bytes": "2048",
                                   "min.cleanable.dirty.ratio": "0.01"}, 1)
    # A restart moves the source's leader epochs past the target's: a copy that kept the
    # source's epoch bytes would show.
    source.stop()
    source.start()

    # Transactions committed and aborted around idempotent plain records, then DeleteRecords
    # into the first batch.
    txn = Producer({"bootstrap.servers": east, "transactional.id": "orders-writer", "linger.ms": 5})
    txn.init_transactions(30)
    plain = Producer({"bootstrap.servers": east, "linger.ms": 0})
    for round_ in range(4):
        plain.produce(TXN, key=b"p%d" % round_, value=b"plain-%d" % round_, partition=0)
        plain.flush(30)
        txn.begin_transaction()
        for i in range(3):
            txn.produce(TXN, key=b"t%d" % i, value=b"%s-%d-%d" % (b"commit" if round_ % 2 else b"abort", round_, i),
                        partition=0)
        txn.flush(30)
        txn.commit_transaction(30) if round_ % 2 else txn.abort_transaction(30)
    admin = AdminClient({"bootstrap.servers": east})
    deleted = admin.delete_records([TopicPartition(TXN, 0, 2)])
    next(iter(deleted.values())).result(30)

    # A compacted topic after the cleaner: 60 updates over 6 keys, in batches of 3 records.
    batched = Producer({"bootstrap.servers": east, "linger.ms": 50})
    for i in range(60):
        key = b"once" if i == 0 else b"k%d" % (i % 5)  # the first batch keeps a record: a gap after it
        batched.produce(COMPACTED, key=key, value=b"v%d-" % i + b"x" * 200, partition=0)
        if i % 3 == 2:
            batched.flush(30)
    part = partition_dir(source.data_dir, COMPACTED, 0)

    def compacted() -> bool:
        active = max(int(p.stem) for p in part.glob("*.log"))
        cleaned = re.findall(rf"cleaned {COMPACTED}-0 up to offset (\d+)", source.log_text())
        return active > 0 and str(active) in cleaned  # nothing is written after: no further pass changes it

    wait_until(compacted, 60, what="the source's cleaner compacting up to the active segment")
    source_disk = {t: disk_batches(source.data_dir, t) for t in (TXN, COMPACTED)}
    spans = [(o, o + struct.unpack_from(">i", b, 23)[0] + 1) for o, b in source_disk[COMPACTED]]
    assert any(end != nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False)), \
        ("no gap to mirror", spans, [struct.unpack_from(">i", b, 57)[0] for _, b in source_disk[COMPACTED]])

    # Mirror topics on the target (replication factor 3) and an ordinary one.
    dr = target.bootstrap
    for t in (TXN, COMPACTED):
        create_topic(dr, t, {"mirror.source": f"east:{t}", "min.insync.replicas": "2"}, 3)
    create_topic(dr, ORDINARY, {}, 3)
    answers = trio.run(mirror, east, dr, [TXN, COMPACTED])

    source_start = {t: answers[t][-1]["log_start_offset"] for t in (TXN, COMPACTED)}
    assert source_start[TXN] == 2, answers[TXN]
    for t in (TXN, COMPACTED):
        last = answers[t][-1]
        src_end = end_offsets(east, t, "read_uncommitted")
        assert last["log_end_offset"] == last["high_watermark"] == src_end, last
        # The source's batches from the one holding its log start; what lies below is gone.
        want = [(o, b) for o, b in source_disk[t] if o + struct.unpack_from(">i", b, 23)[0] >= source_start[t]]
        target_epochs = set()
        for node, broker in target.brokers.items():
            def replica_complete(broker: BrokerProcess = broker, t: str = t, last: int = want[-1][0]) -> bool:
                got = disk_batches(broker.data_dir, t)
                return bool(got) and got[-1][0] == last
            wait_until(replica_complete, 30, what=f"node {node}'s replica of {t} catching up")
            got = disk_batches(broker.data_dir, t)
            assert [o for o, _ in got] == [o for o, _ in want], (node, t)
            assert [without_epoch(b) for _, b in got] == [without_epoch(b) for _, b in want], (node, t)
            target_epochs |= {epoch_of(b) for _, b in got}
            assert (partition_dir(broker.data_dir, t, 0) / "leader-epoch-checkpoint").exists()
        source_epochs = {epoch_of(b) for _, b in want}
        assert len(target_epochs) == 1 and target_epochs != source_epochs, (t, target_epochs, source_epochs)

    # Consumers of both isolation levels read the same records at the same offsets.
    for t in (TXN, COMPACTED):
        for isolation in ("read_committed", "read_uncommitted"):
            end = end_offsets(east, t, isolation)
            assert end_offsets(dr, t, isolation) == end
            on_source = read_records(east, t, isolation, end)
            assert read_records(dr, t, isolation, end) == on_source, (t, isolation)
            if t == TXN:
                values = [v for _, _, v in on_source]
                assert any((v or b"").startswith(b"abort") for v in values) == (isolation == "read_uncommitted")

    # Producers are refused on a mirror topic; MirrorAppend outside mirror topics and under
    # another topic id.
    err, _ = produce(dr, TXN, b"not here")
    assert err is not None and err.code() == KafkaError.TOPIC_EXCEPTION, err
    batch = source_disk[TXN][-1][1]
    ordinary = trio.run(append_once, dr, ORDINARY, None, batch)
    assert ordinary["error_code"] == ErrorCode.invalid_request and "mirror.source" in ordinary["error_message"]
    wrong_id = trio.run(append_once, dr, TXN, str(uuid.uuid4()), batch)
    assert wrong_id["error_code"] == ErrorCode.unknown_topic_id, wrong_id

    # Promotion: the topic takes producers again, after the mirrored offsets. The target's
    # first producer id is one the source's transactional producer had: the promoted topic
    # must not take it for that producer (fenced, out of order, or a "duplicate").
    end = end_offsets(dr, TXN, "read_uncommitted")
    mirrored_pids = {producer_id_of(b) for _, b in source_disk[TXN]} - {-1}
    _delete_mirror_source(dr, TXN)
    wait_until(lambda: trio.run(leader_sees_promotion, dr, TXN), 30, what="the leader applying the promotion")
    err, offset = produce(dr, TXN, b"after promotion", **{"enable.idempotence": True, "acks": "all",
                                                           "message.send.max.retries": 5})
    assert err is None and offset == end, (err, offset, end)
    new_batch = next(b for o, b in disk_batches(target[1].data_dir, TXN) if o == end)
    assert producer_id_of(new_batch) in mirrored_pids, "the target's producer id differs: no collision tested"
    assert read_records(dr, TXN, "read_committed", end + 1)[-1] == (end, None, b"after promotion")


def _delete_mirror_source(bootstrap: str, topic: str) -> None:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("mirror.source", None, incremental_operation=AlterConfigOpType.DELETE)])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer: its futures die with it
    next(iter(admin.incremental_alter_configs([resource]).values())).result(30)
