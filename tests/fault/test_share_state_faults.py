"""Share-group state survives its leader (KIP-932, issue 44): on a 3-broker cluster, a share
consumer (raw protocol, so every acknowledgement's answer is known) acquires a topic
partition's records and accepts or rejects a seeded part of them; the partition's leader is
killed -9. Once a surviving broker leads it, the group's records come again exactly as the
durable state says: every record neither accepted nor rejected is delivered, and no accepted
or rejected one ever is (exact sets). Replay a schedule with DCMIRROR_FAULT_SEED=N."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from cluster.protocol.messages import decode_response, encode_request
from cluster.protocol.record_batch import iter_headers
from cluster.protocol.records import decode_batch
from tests.cluster_helpers import (
    create_topic,
    fast_teardown,
    led_by,
    metadata,
    partitions_of,
    topic_ready,
    wait_until,
)
from tests.fault_workload import fault_rng
from tests.harness import ClusterProcesses

pytestmark = [pytest.mark.timeout(300), pytest.mark.heavy]

TOPIC, GROUP = "share-durable", "sg-durable"
ALL = [1, 2, 3]
PROGRESS_S = 60.0  # the longest a step may go without progress
HEARTBEAT, SHARE_FETCH, SHARE_ACKNOWLEDGE = 76, 78, 79
ACCEPT, REJECT = 1, 3
NOT_COORDINATOR_ERRORS = {14, 15, 16}  # load in progress, not available, not coordinator


@pytest.fixture
def clusters(cluster_factory: Callable[..., ClusterProcesses]) -> Iterator[Callable[..., ClusterProcesses]]:
    yield from fast_teardown(cluster_factory)


class Raw:
    """One connection speaking ShareGroupHeartbeat/ShareFetch/ShareAcknowledge v1."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation = 0

    def ask(self, api: int, body: dict[str, Any]) -> Any:
        self.correlation += 1
        self.sock.sendall(encode_request(api, 1, self.correlation, b"raw-share", body))
        (length,) = struct.unpack(">i", self._read(4))
        return decode_response(api, 1, self._read(length))

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, "the broker closed the connection"
            out += chunk
        return out

    def close(self) -> None:
        self.sock.close()


def join(cluster: ClusterProcesses, nodes: list[int], member: str) -> Any:
    """The member joins the group at whichever live broker coordinates it: its topic id."""
    def attempt() -> Any:
        for node in nodes:
            raw = Raw(cluster[node].bootstrap)
            try:
                got = raw.ask(HEARTBEAT, {"group_id": GROUP, "member_id": member, "member_epoch": 0,
                                          "rack_id": None, "subscribed_topic_names": [TOPIC]})
            finally:
                raw.close()
            if got.error_code == 0 and got.assignment is not None and got.assignment.topic_partitions:
                return got.assignment.topic_partitions[0].topic_id
            assert got.error_code in NOT_COORDINATOR_ERRORS or got.error_code == 0, got
        return None
    return wait_until(attempt, PROGRESS_S, f"{member} joined {GROUP} with an assignment", cluster)


class Member:
    """A share session at the partition's leader."""

    def __init__(self, leader_bootstrap: str, member: str, topic_id: Any) -> None:
        self.raw, self.member, self.topic_id, self.epoch = Raw(leader_bootstrap), member, topic_id, 0

    def fetch(self, max_wait_ms: int = 500) -> tuple[list[tuple[int, int, int]], dict[int, bytes]]:
        """One ShareFetch: the acquired (first, last, delivery count) ranges and each
        acquired offset's value."""
        partitions = [{"partition_index": 0, "acknowledgement_batches": []}] if self.epoch == 0 else []
        got = self.raw.ask(SHARE_FETCH, {
            "group_id": GROUP, "member_id": self.member, "share_session_epoch": self.epoch, "max_wait": max_wait_ms,
            "min_bytes": 1, "max_bytes": 1 << 20, "max_records": 500, "batch_size": 500,
            "topics": [{"topic_id": self.topic_id, "partitions": partitions}] if partitions else [],
            "forgotten_topics_data": []})
        assert got.error_code == 0, got
        self.epoch += 1
        ranges: list[tuple[int, int, int]] = []
        values: dict[int, bytes] = {}
        for t in got.responses:
            for p in t.partitions:
                assert p.error_code == 0, p
                ranges += [(r.first_offset, r.last_offset, r.delivery_count) for r in p.acquired_records]
                if p.records:
                    values.update(_values(bytes(p.records)))
        acquired = {o for first, last, _ in ranges for o in range(first, last + 1)}
        return ranges, {o: v for o, v in values.items() if o in acquired}

    def acknowledge(self, kinds: dict[int, int]) -> int:
        batches = [{"first_offset": o, "last_offset": o, "acknowledge_types": [k]} for o, k in sorted(kinds.items())]
        got = self.raw.ask(SHARE_ACKNOWLEDGE, {
            "group_id": GROUP, "member_id": self.member, "share_session_epoch": self.epoch,
            "topics": [{"topic_id": self.topic_id, "partitions": [
                {"partition_index": 0, "acknowledgement_batches": batches}]}]})
        self.epoch += 1
        assert got.error_code == 0, got
        return int(got.responses[0].partitions[0].error_code)


def _values(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for pos, header in iter_headers(data):
        if not header.is_control:
            out.update((r.offset, r.value or b"") for r in decode_batch(data, pos)[1])
    return out


def produce(bootstrap: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 3, "linger.ms": 5})
    for v in values:
        p.produce(TOPIC, v, partition=0)
    assert p.flush(30) == 0


def test_a_share_partition_leader_killed_9_loses_no_acknowledgement_and_no_record(
        clusters: Callable[..., ClusterProcesses]) -> None:
    rng = fault_rng("share-state-leader-kill")
    cluster = clusters(3)
    create_topic(cluster.bootstrap, TOPIC, 1, 3)
    wait_until(lambda: topic_ready(cluster, TOPIC, 1, 3), 30, f"{TOPIC}: one partition, RF 3, a full ISR", cluster)
    leader = partitions_of(metadata(cluster.bootstrap, TOPIC), TOPIC)[0].leader
    topic_id = join(cluster, ALL, "member-before-the-kill-00001")
    before = Member(cluster[leader].bootstrap, "member-before-the-kill-00001", topic_id)
    ranges, _ = before.fetch(0)  # the share partition starts (its start written) at the log end
    assert not ranges, ranges

    count = rng.randrange(20, 60)
    produce(cluster.bootstrap, [f"r-{i}".encode() for i in range(count)])
    held: dict[int, bytes] = {}
    last = time.monotonic()
    while len(held) < count:
        ranges, values = before.fetch()
        assert all(d == 1 for _, _, d in ranges), ranges
        if values:
            last = time.monotonic()
        held.update(values)
        assert time.monotonic() - last < PROGRESS_S, f"acquired {len(held)} of {count}"
    assert sorted(held.values()) == sorted(f"r-{i}".encode() for i in range(count))
    offsets = sorted(held)
    settled = rng.sample(offsets, rng.randrange(2, count))
    kinds = {o: rng.choice([ACCEPT, REJECT]) for o in settled}
    kinds[settled[0]], kinds[settled[1]] = ACCEPT, REJECT  # one of each at least
    # Acknowledged in a few calls, each answered only once its state is written.
    chunks = sorted(kinds.items())
    cut = sorted(rng.sample(range(1, len(chunks)), min(2, len(chunks) - 1))) if len(chunks) > 1 else []
    for part in (chunks[a:b] for a, b in zip([0, *cut], [*cut, len(chunks)], strict=True)):
        assert before.acknowledge(dict(part)) == 0
    accepted = {held[o] for o, k in kinds.items() if k == ACCEPT}
    rejected = {held[o] for o, k in kinds.items() if k == REJECT}
    unsettled = {held[o] for o in offsets if o not in kinds}
    print(f"{count} records: {len(accepted)} accepted, {len(rejected)} rejected, {len(unsettled)} held; "
          f"killing the leader, broker {leader}", flush=True)

    cluster[leader].kill9()
    survivors = [n for n in ALL if n != leader]
    live = cluster.bootstrap_of(*survivors)
    new_leader = wait_until(lambda: led_by(live, TOPIC, 1, survivors), PROGRESS_S,
                            f"{TOPIC}-0 led by one of {survivors}", cluster)[0].leader
    topic_id = join(cluster, survivors, "member-after-the-kill-000001")
    after = Member(cluster[new_leader].bootstrap, "member-after-the-kill-000001", topic_id)
    produce(live, [b"sentinel"])  # the last record: once it is delivered, nothing before it waits
    again: list[bytes] = []
    last = time.monotonic()
    while b"sentinel" not in again:
        try:
            _, values = after.fetch()
        except AssertionError:  # the new leader still reading the share state, or not yet serving
            after.raw.close()
            after = Member(cluster[new_leader].bootstrap, after.member, topic_id)
            values = {}
        if values:
            last = time.monotonic()
            assert after.acknowledge(dict.fromkeys(values, ACCEPT)) == 0
        again += [values[o] for o in sorted(values)]
        assert time.monotonic() - last < PROGRESS_S, f"after the kill: {sorted(again)}"
    again.remove(b"sentinel")
    assert not set(again) & accepted, f"accepted records delivered again: {sorted(set(again) & accepted)}"
    assert not set(again) & rejected, f"rejected records delivered again: {sorted(set(again) & rejected)}"
    assert sorted(again) == sorted(unsettled), f"held records not delivered again: {sorted(unsettled - set(again))}"
