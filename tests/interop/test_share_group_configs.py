"""A share group's configs in force at its share partitions, and ShareFetch/ShareAcknowledge v2
(docs/share_groups.md), against a broker process: `share.isolation.level=read_committed` never
delivers an aborted transaction's records; `share.record.lock.duration.ms=1000` (set with Kafka's
kafka-configs) brings an unacknowledged record back about a second after it was acquired;
`share.delivery.count.limit=2` archives a record released twice; v2's acquire modes, RENEW only
with IsRenewAck, a renewing fetch that asks for records refused, and RENEW holding a record past
its lock. Raw protocol where the versions matter (librdkafka's share consumer speaks v1 only).

The broker allows group lock durations from 1,000 ms (`group.share.min.record.lock.duration.ms`,
Kafka's default 15,000). Every wait is bounded by progress: records are read until a later
one arrives (acquisition goes in offset order, so an earlier record that could be delivered
would have come first)."""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from cluster.protocol.messages import decode_response, encode_request
from cluster.protocol.record_batch import iter_headers
from cluster.protocol.records import decode_batch
from tests.harness import BrokerProcess
from tests.peers.kafka import run_tool

pytestmark = pytest.mark.timeout(300)

PROGRESS_S = 60.0  # the longest a step may go without progress
LOCK_MS = 1_000
HEARTBEAT, SHARE_FETCH, SHARE_ACKNOWLEDGE = 76, 78, 79
ACCEPT, RELEASE, RENEW = 1, 2, 4
INVALID_REQUEST = 42


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("share-configs") / "broker", group_initial_rebalance_delay_ms=0,
                      **{"group.share.min.record.lock.duration.ms": LOCK_MS}).start()
    try:
        yield b
    finally:
        b.stop()


def make_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)


def set_group_configs(bootstrap: str, group: str, **configs: str) -> None:
    """confluent-kafka's AdminClient: IncrementalAlterConfigs on the GROUP resource."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    admin.incremental_alter_configs([resource])[resource].result(30)


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """The values in one batch (queued before the flush sends them)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1_000, "log_level": 3})
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0


class Member:
    """One share-group member over its own connection, speaking the version it is told."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.group, self.member, self.correlation, self.epoch = group, f"{name}-{uuid.uuid4().hex[:12]}", 0, 0
        joined = self.ask(HEARTBEAT, 1, {"group_id": group, "member_id": self.member, "member_epoch": 0,
                                         "rack_id": None, "subscribed_topic_names": [topic]})
        assert joined.error_code == 0 and joined.assignment is not None, joined
        self.topic_id = joined.assignment.topic_partitions[0].topic_id

    def ask(self, api: int, version: int, body: dict[str, Any]) -> Any:
        self.correlation += 1
        self.sock.sendall(encode_request(api, version, self.correlation, b"share-configs", body))
        (length,) = struct.unpack(">i", self._read(4))
        return decode_response(api, version, self._read(length))

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, "the broker closed the connection"
            out += chunk
        return out

    def fetch(self, version: int = 2, max_records: int = 100, mode: int = 0, max_wait_ms: int = 300,
              acks: Sequence[tuple[int, int, int]] = (), renew: bool = False) -> Any:
        """One ShareFetch (the session opened by the first); acknowledgements piggybacked."""
        partition = {"partition_index": 0, "acknowledgement_batches": [
            {"first_offset": f, "last_offset": last, "acknowledge_types": [k]} for f, last, k in acks]}
        body: dict[str, Any] = {
            "group_id": self.group, "member_id": self.member, "share_session_epoch": self.epoch,
            "max_wait": max_wait_ms, "min_bytes": 1, "max_bytes": 1 << 20, "max_records": max_records,
            "batch_size": max_records, "share_acquire_mode": mode, "is_renew_ack": renew,
            "topics": [{"topic_id": self.topic_id, "partitions": [partition]}] if self.epoch == 0 or acks else [],
            "forgotten_topics_data": []}
        if renew:
            body.update(max_wait=0, min_bytes=0, max_bytes=0, max_records=0)
        got = self.ask(SHARE_FETCH, version, body)
        if got.error_code == 0:
            self.epoch += 1
        return got

    def acknowledge(self, acks: list[tuple[int, int, int]], version: int = 2, renew: bool = False) -> Any:
        got = self.ask(SHARE_ACKNOWLEDGE, version, {
            "group_id": self.group, "member_id": self.member, "share_session_epoch": self.epoch,
            "is_renew_ack": renew, "topics": [{"topic_id": self.topic_id, "partitions": [{
                "partition_index": 0, "acknowledgement_batches": [
                    {"first_offset": f, "last_offset": last, "acknowledge_types": [k]} for f, last, k in acks]}]}]})
        assert got.error_code == 0, got
        self.epoch += 1
        return got

    def acquired(self, got: Any) -> dict[int, tuple[bytes, int]]:
        """An answer's acquired offsets: (value, delivery count)."""
        assert got.error_code == 0, got
        out: dict[int, tuple[bytes, int]] = {}
        for t in got.responses:
            for p in t.partitions:
                assert p.error_code == 0, p
                values = _values(bytes(p.records)) if p.records else {}
                for r in p.acquired_records:
                    for o in range(r.first_offset, r.last_offset + 1):
                        out[o] = (values.get(o, b""), r.delivery_count)
        return out

    def fetch_until(self, done: Any, **kwargs: Any) -> dict[int, tuple[bytes, int]]:
        """Fetches until `done(acquired)` holds, at most PROGRESS_S without anything acquired."""
        last = time.monotonic()
        while True:
            got = self.acquired(self.fetch(**kwargs))
            if got:
                last = time.monotonic()
            if done(got):
                return got
            assert time.monotonic() - last < PROGRESS_S, f"{self.member}: nothing acquired for {PROGRESS_S} s"

    def close(self) -> None:
        self.sock.close()


def _values(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for pos, header in iter_headers(data):
        if not header.is_control:
            out.update((r.offset, r.value or b"") for r in decode_batch(data, pos)[1])
    return out


def test_read_committed_never_delivers_an_aborted_transaction(broker: BrokerProcess) -> None:
    """share.isolation.level=read_committed (and earliest): a committed transaction, an aborted
    one, a committed one; the share consumer gets the committed records only. A
    read_uncommitted group on the same topic gets the aborted ones too (the config decides)."""
    topic = "share-read-committed"
    make_topic(broker.bootstrap, topic)
    set_group_configs(broker.bootstrap, "sg-committed", share_isolation_level="read_committed",
                      share_auto_offset_reset="earliest")
    set_group_configs(broker.bootstrap, "sg-uncommitted", share_auto_offset_reset="earliest")
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "share-txn", "log_level": 3})
    p.init_transactions(30)
    for tag, commit in (("c1", True), ("a", False), ("c2", True)):
        p.begin_transaction()
        for i in range(3):
            p.produce(topic, f"{tag}-{i}".encode(), partition=0)
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)

    def read(group: str, last: bytes) -> list[bytes]:
        c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "log_level": 3})
        c.subscribe([topic])
        try:
            got: list[bytes] = []
            progress = time.monotonic()
            while last not in got:
                fresh = [m.value() for m in c.poll(0.3) if m.error() is None]
                if fresh:
                    progress = time.monotonic()
                got += fresh
                assert time.monotonic() - progress < PROGRESS_S, f"{group} read only {got}"
            return got
        finally:
            c.close()

    committed = [f"{t}-{i}".encode() for t in ("c1", "c2") for i in range(3)]
    assert read("sg-committed", b"c2-2") == committed  # offset order: an aborted one would come before c2-*
    assert sorted(read("sg-uncommitted", b"c2-2")) == sorted(committed + [b"a-0", b"a-1", b"a-2"])


def test_a_lock_of_1000_ms_set_by_kafka_configs_brings_an_unacknowledged_record_back(broker: BrokerProcess,
                                                                                     tmp_path: Path) -> None:
    """kafka-configs sets share.record.lock.duration.ms=1000 on the group: AcquisitionLockTimeoutMs
    says 1000, and a record member A acquired and never acknowledged is acquired by member B
    (delivery count 2) no sooner than 1 s and well within the default 30 s after A took it."""
    topic, group = "share-lock-1s", "sg-lock"
    make_topic(broker.bootstrap, topic)
    done = run_tool("kafka-configs", "--bootstrap-server", broker.bootstrap, "--alter", "--entity-type", "groups",
                    "--entity-name", group, "--add-config",
                    f"share.record.lock.duration.ms={LOCK_MS},share.auto.offset.reset=earliest", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    a, b = (Member(broker.bootstrap, group, topic, n) for n in ("a", "b"))
    try:
        opened = b.fetch(max_wait_ms=0)  # B's session opens (and the share partition starts) first
        assert not b.acquired(opened)
        assert opened.acquisition_lock_timeout.total_seconds() * 1000 == LOCK_MS, opened
        produce(broker.bootstrap, topic, [b"held"])
        taken_at = time.monotonic()
        assert a.fetch_until(bool, max_records=1) == {0: (b"held", 1)}
        back = b.fetch_until(bool)
        held_s = time.monotonic() - taken_at
        assert back == {0: (b"held", 2)}
        assert LOCK_MS / 1000 <= held_s < LOCK_MS / 1000 + 10, held_s
        # A's lock is gone: its late acceptance is refused
        assert a.acknowledge([(0, 0, ACCEPT)]).responses[0].partitions[0].error_code == 121  # INVALID_RECORD_STATE
    finally:
        a.close()
        b.close()


def test_delivery_count_limit_2_archives_a_record_released_twice(broker: BrokerProcess) -> None:
    """share.delivery.count.limit=2 (AdminClient): a record released on its first and second
    delivery is archived; the next record is delivered and it never comes again."""
    topic, group = "share-limit-2", "sg-limit"
    make_topic(broker.bootstrap, topic)
    set_group_configs(broker.bootstrap, group, share_delivery_count_limit="2", share_auto_offset_reset="earliest")
    produce(broker.bootstrap, topic, [b"poison"])
    m = Member(broker.bootstrap, group, topic, "m")
    try:
        for delivery in (1, 2):
            assert m.fetch_until(bool, max_records=1) == {0: (b"poison", delivery)}
            assert m.acknowledge([(0, 0, RELEASE)]).responses[0].partitions[0].error_code == 0
        produce(broker.bootstrap, topic, [b"after"])
        got = m.fetch_until(lambda got: any(v == b"after" for v, _ in got.values()))
        assert got == {1: (b"after", 1)}, got  # offset 0 would have come first
    finally:
        m.close()


def test_share_fetch_v2_acquire_modes_renew_and_its_refusals(broker: BrokerProcess) -> None:
    """v2: record_limit acquires MaxRecords of a 10-record batch, batch_optimized the whole
    batch; RENEW is refused in v1 and without IsRenewAck (INVALID_REQUEST, nothing applied), a
    renewing fetch asking for records is refused; RENEW every 200 ms holds a record past three
    of its 1 s locks, ShareAcknowledge v2 answering AcquisitionLockTimeoutMs; then it is accepted."""
    topic, group = "share-v2", "sg-v2"
    make_topic(broker.bootstrap, topic)
    set_group_configs(broker.bootstrap, group, share_record_lock_duration_ms=str(LOCK_MS),
                      share_auto_offset_reset="earliest")
    produce(broker.bootstrap, topic, [f"r-{i}".encode() for i in range(10)])
    m = Member(broker.bootstrap, group, topic, "m")
    other = Member(broker.bootstrap, group, topic, "other")
    try:
        assert sorted(m.fetch_until(bool, max_records=3, mode=1)) == [0, 1, 2]  # record_limit
        assert sorted(other.fetch_until(bool, max_records=2, mode=0)) == list(range(3, 10))  # the batch's rest
        # RENEW where it is not allowed: v1, and v2 without IsRenewAck
        refused = m.acknowledge([(0, 0, RENEW)], version=1)
        assert refused.responses[0].partitions[0].error_code == INVALID_REQUEST
        refused = m.acknowledge([(0, 0, RENEW)], version=2, renew=False)
        assert refused.responses[0].partitions[0].error_code == INVALID_REQUEST
        asking = m.ask(SHARE_FETCH, 2, {
            "group_id": group, "member_id": m.member, "share_session_epoch": m.epoch, "max_wait": 0, "min_bytes": 0,
            "max_bytes": 0, "max_records": 5, "batch_size": 5, "share_acquire_mode": 0, "is_renew_ack": True,
            "topics": [], "forgotten_topics_data": []})
        assert asking.error_code == INVALID_REQUEST and "maxRecords must be set to 0" in asking.error_message
        # RENEW holds record 0 past three lock durations; 1 and 2 go back (their locks ran out)
        taken = time.monotonic()
        while time.monotonic() - taken < 3 * LOCK_MS / 1000:
            renewed = m.fetch(acks=[(0, 0, RENEW)], renew=True)
            assert renewed.error_code == 0 and [p.acknowledge_error_code for t in renewed.responses
                                                for p in t.partitions] == [0], renewed
            assert not m.acquired(renewed)  # a renewing fetch fetches nothing
            time.sleep(0.2)  # pacing the renewals (a fifth of the lock), not waiting for a state
        answer = m.acknowledge([(0, 0, RENEW)], renew=True)
        assert answer.responses[0].partitions[0].error_code == 0
        assert answer.acquisition_lock_timeout.total_seconds() * 1000 == LOCK_MS
        assert m.acknowledge([(0, 0, ACCEPT)]).responses[0].partitions[0].error_code == 0
        back = other.fetch_until(lambda got: 1 in got and 2 in got)
        assert back[1][1] == back[2][1] == 2 and 0 not in back
    finally:
        m.close()
        other.close()
