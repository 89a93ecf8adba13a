"""Share groups (KIP-932, a preview: docs/share_groups.md) with librdkafka's share consumer
(confluent-kafka's ShareConsumer) against a real broker process: members that outnumber the
partitions share them and every record is delivered to one of them once; explicit
acknowledgements release (delivered again, its delivery count 2), reject (never again) and
accept; a member that closes gives back what it held.

A share partition starts at the log end when a member first fetches it
(`share.auto.offset.reset=latest`, Kafka's default), so each test first writes warm-up records
until every partition has delivered one (progress, not a guessed time), then the records it
counts."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.harness import BrokerProcess

pytestmark = pytest.mark.timeout(300)

PROGRESS_S = 60.0  # the longest a step may go without a record arriving


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("share") / "broker", group_initial_rebalance_delay_ms=0).start()
    try:
        yield b
    finally:
        b.stop()


def make_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: a collected client cancels its futures
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def consumer(bootstrap: str, group: str, topic: str, explicit: bool = False) -> ShareConsumer:
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3}
    if explicit:
        conf["share.acknowledgement.mode"] = "explicit"
    c = ShareConsumer(conf)
    c.subscribe([topic])
    if explicit:
        _EXPLICIT[id(c)] = c  # held: an id is never reused while its consumer is in here
    return c


def warm_up(bootstrap: str, topic: str, partitions: int, consumers: list[ShareConsumer]) -> None:
    """Warm-up records (value "warm") to every partition until each has delivered one: the
    share partitions have started. Explicit consumers accept them."""
    p = Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    seen: set[int] = set()
    last = time.monotonic()
    while len(seen) < partitions:
        for q in range(partitions):
            p.produce(topic, b"warm", partition=q)
        p.flush(10)
        for c in consumers:
            for m in c.poll(0.3):
                if m.error() is None:
                    assert m.value() == b"warm", "a counted record before the counting began"
                    seen.add(m.partition())
                    if _explicit(c):
                        c.acknowledge(m, AcknowledgeType.ACCEPT)
                    last = time.monotonic()
        assert time.monotonic() - last < PROGRESS_S, f"partitions {sorted(seen)} of {partitions} delivered"


_EXPLICIT: dict[int, ShareConsumer] = {}


def _explicit(c: ShareConsumer) -> bool:
    return _EXPLICIT.get(id(c)) is c


def describe(bootstrap: str, group: str) -> object:
    """ShareGroupDescribe v1 of one group over a raw socket (one broker: the coordinator)."""
    import socket
    import struct

    from cluster.protocol.messages import decode_response, encode_request

    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(encode_request(77, 1, 1, b"test", {"group_ids": [group], "include_authorized_operations": False}))
        (length,) = struct.unpack(">i", _read(s, 4))
        return decode_response(77, 1, _read(s, length)).groups[0]  # type: ignore[attr-defined]


def _read(s: object, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))  # type: ignore[attr-defined]
        assert chunk, "closed"
        out += chunk
    return out


def produce_counted(bootstrap: str, topic: str, partitions: int, count: int, tag: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "log_level": 3, "linger.ms": 5})
    for i in range(count):
        p.produce(topic, f"{tag}-{i}".encode(), partition=i % partitions)
    assert p.flush(30) == 0


def test_members_outnumbering_partitions_share_them_and_each_record_is_delivered_once(broker: BrokerProcess) -> None:
    topic, partitions, count = "share-three-on-two", 2, 400
    make_topic(broker.bootstrap, topic, partitions)
    members = [consumer(broker.bootstrap, "sg-three", topic) for _ in range(3)]
    try:
        warm_up(broker.bootstrap, topic, partitions, members)
        produce_counted(broker.bootstrap, topic, partitions, count, "job")
        got: Counter[bytes] = Counter()
        last = time.monotonic()
        while sum(got.values()) < count:
            for c in members:
                for m in c.poll(0.2):
                    if m.error() is None and m.value() != b"warm":
                        got[m.value()] += 1
                        last = time.monotonic()
            assert time.monotonic() - last < PROGRESS_S, f"{sum(got.values())} of {count} delivered"
        for c in members:  # a moment more: nothing is delivered a second time
            for m in c.poll(0.5):
                if m.error() is None and m.value() != b"warm":
                    got[m.value()] += 1
        assert set(got) == {f"job-{i}".encode() for i in range(count)}
        assert max(got.values()) == 1, [v for v, n in got.items() if n > 1][:5]
        # Which member gets how many records is timing (the first to fetch may take all); the
        # assignment is not: three members on two partitions, each partition read by two.
        # A member's assignment is what its last heartbeat (every 5 s) answered: converging.
        deadline = time.monotonic() + 3 * 5 + PROGRESS_S / 4
        while True:
            described = describe(broker.bootstrap, "sg-three")
            assert (described.error_code, described.group_state, len(described.members)) == (0, "Stable", 3)
            held = Counter(p for m in described.members for t in m.assignment.topic_partitions for p in t.partitions)
            if held == Counter({0: 2, 1: 2}) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert held == Counter({0: 2, 1: 2}), held
        assert all(t.topic_name == topic for m in described.members for t in m.assignment.topic_partitions)
        listed = AdminClient({"bootstrap.servers": broker.bootstrap}).list_consumer_groups().result(30)
        assert "sg-three" not in {g.group_id for g in listed.valid}  # consumer groups only (types filter)
    finally:
        for c in members:
            c.close()


def test_explicit_acknowledgements_release_reject_and_accept(broker: BrokerProcess) -> None:
    """RELEASE: delivered again with delivery count 2; REJECT: never again; ACCEPT: done."""
    topic, partitions, count = "share-explicit", 1, 60
    make_topic(broker.bootstrap, topic, partitions)
    c = consumer(broker.bootstrap, "sg-explicit", topic, explicit=True)
    try:
        warm_up(broker.bootstrap, topic, partitions, [c])
        produce_counted(broker.bootstrap, topic, partitions, count, "task")
        deliveries: list[tuple[int, int, int]] = []  # (task number, offset, delivery count)
        accepted: set[int] = set()
        last = time.monotonic()
        rejected = {i for i in range(count) if i % 10 == 7}
        while len(accepted) + len(rejected) < count or len([d for d in deliveries if d[0] in rejected]) < len(rejected):
            for m in c.poll(0.3):
                if m.error() is not None or m.value() == b"warm":
                    if m.error() is None:
                        c.acknowledge(m, AcknowledgeType.ACCEPT)
                    continue
                n = int(m.value().split(b"-")[1])
                deliveries.append((n, m.offset(), m.delivery_count()))
                last = time.monotonic()
                if n in rejected:
                    c.acknowledge(m, AcknowledgeType.REJECT)
                elif n % 3 == 0 and m.delivery_count() == 1:
                    c.acknowledge(m, AcknowledgeType.RELEASE)
                else:
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                    assert n not in accepted, f"task {n} accepted twice"
                    accepted.add(n)
            assert time.monotonic() - last < PROGRESS_S, f"{len(accepted)} accepted of {count - len(rejected)}"
        for m in c.poll(1.0):  # nothing more comes: every record is settled
            assert m.error() is not None or m.value() == b"warm", m.value()
        assert accepted == set(range(count)) - rejected
        times = Counter(n for n, _, _ in deliveries)
        released = {n for n in range(count) if n % 3 == 0 and n not in rejected}
        assert {n for n, k in times.items() if k == 2} == released and max(times.values()) == 2
        assert Counter(k for n, _, k in deliveries if n in released) == Counter({1: len(released), 2: len(released)})
        assert all(times[n] == 1 for n in rejected)
    finally:
        c.close()


def test_a_member_that_closes_gives_back_what_it_held(broker: BrokerProcess) -> None:
    """A member polls records and closes without acknowledging them (explicit mode): its
    share session closes and the records go back at once (no lock timeout waited: 30 s),
    so another member of the group gets each of them."""
    topic, partitions, count = "share-handover", 1, 40
    make_topic(broker.bootstrap, topic, partitions)
    first = consumer(broker.bootstrap, "sg-handover", topic, explicit=True)
    second = consumer(broker.bootstrap, "sg-handover", topic)
    try:
        warm_up(broker.bootstrap, topic, partitions, [first])
        produce_counted(broker.bootstrap, topic, partitions, count, "held")
        held: set[bytes] = set()
        last = time.monotonic()
        while not held:
            held = {m.value() for m in first.poll(0.3) if m.error() is None and m.value() != b"warm"}
            assert time.monotonic() - last < PROGRESS_S, "the first member got nothing"
        started = time.monotonic()
        first.close()
        got: set[bytes] = set()
        last = time.monotonic()
        while not held <= got:
            got |= {m.value() for m in second.poll(0.3) if m.error() is None}
            if got:
                last = time.monotonic()
            assert time.monotonic() - last < PROGRESS_S, f"{len(held - got)} held records never came back"
        assert time.monotonic() - started < 25, "the records came back only at their lock timeout (30 s)"
    finally:
        second.close()


KILLED_MEMBER = """
import sys, time
from confluent_kafka import ShareConsumer
c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "log_level": 3,
                   "share.acknowledgement.mode": "explicit"})
c.subscribe([sys.argv[3]])
while True:
    got = [m for m in c.poll(0.3) if m.error() is None]
    held = [m for m in got if m.value().startswith(b"held")]
    if held:
        print(" ".join(m.value().decode() for m in held), flush=True)
        time.sleep(3600)  # holds them, acknowledging nothing, until killed
    for m in got:  # warm-up records it shares with the survivor: accepted (explicit mode polls
        c.acknowledge(m)  # again only once the last poll's records are acknowledged)
"""


def test_a_member_killed_9_gives_back_what_it_held_when_its_connection_ends(broker: BrokerProcess,
                                                                             tmp_path: Path) -> None:
    """A member process killed -9 while holding records never says goodbye: its connection
    ending ends its share session, and the records go back at once (not after their 30 s lock)."""
    import signal
    import subprocess
    import sys

    topic, partitions, count = "share-killed", 1, 30
    make_topic(broker.bootstrap, topic, partitions)
    survivor = consumer(broker.bootstrap, "sg-killed", topic)
    script = tmp_path / "member.py"
    script.write_text(KILLED_MEMBER)
    member = subprocess.Popen([sys.executable, str(script), broker.bootstrap, "sg-killed", topic],
                              stdout=subprocess.PIPE, text=True)
    try:
        warm_up(broker.bootstrap, topic, partitions, [survivor])
        # The survivor stops polling (it would take everything); the member gets the records.
        produce_counted(broker.bootstrap, topic, partitions, count, "held")
        assert member.stdout is not None
        line = member.stdout.readline()  # blocks until the member holds records (or dies)
        held = set(line.split())
        assert held, "the member got nothing"
        member.send_signal(signal.SIGKILL)
        member.wait(30)
        started = time.monotonic()
        got: set[str] = set()
        last = time.monotonic()
        while not held <= got:
            fresh = {m.value().decode() for m in survivor.poll(0.3) if m.error() is None}
            if fresh - got:
                last = time.monotonic()
            got |= fresh
            assert time.monotonic() - last < PROGRESS_S, f"{len(held - got)} held records never came back"
        assert time.monotonic() - started < 25, "the records came back only at their lock timeout (30 s)"
    finally:
        if member.poll() is None:
            member.kill()
        survivor.close()


def test_a_closing_share_fetch_acknowledges_before_it_gives_back(broker: BrokerProcess) -> None:
    """ShareFetch with session epoch -1 carrying acknowledgements (raw protocol): the accepted
    records stay accepted, only the rest goes back to the group (acknowledged first, then the
    session's records released)."""
    import socket
    import struct
    import uuid

    from cluster.protocol.messages import decode_response, encode_request

    topic, group = "share-final-fetch", "sg-final"
    make_topic(broker.bootstrap, topic, 1)
    host, port = broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        correlation = 0

        def ask(api: int, body: dict[str, object]) -> object:
            nonlocal correlation
            correlation += 1
            s.sendall(encode_request(api, 1, correlation, b"raw", body))
            (length,) = struct.unpack(">i", _read(s, 4))
            return decode_response(api, 1, _read(s, length))

        member = "raw-member-000000000001"
        joined = ask(76, {"group_id": group, "member_id": member, "member_epoch": 0, "rack_id": None,
                          "subscribed_topic_names": [topic]})
        topic_id = joined.assignment.topic_partitions[0].topic_id  # type: ignore[attr-defined]
        fetch = {"group_id": group, "member_id": member, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
                 "max_records": 100, "batch_size": 100, "forgotten_topics_data": []}
        first = ask(78, {**fetch, "share_session_epoch": 0,
                         "topics": [{"topic_id": topic_id, "partitions": [{"partition_index": 0,
                                                                           "acknowledgement_batches": []}]}]})
        assert first.error_code == 0, first  # type: ignore[attr-defined]
        produce_counted(broker.bootstrap, topic, 1, 6, "final")  # after the share partition started
        acquired: list[tuple[int, int]] = []
        epoch = 1
        last = time.monotonic()
        while not acquired:
            got = ask(78, {**fetch, "share_session_epoch": epoch, "max_wait": 500, "topics": []})
            epoch += 1
            acquired = [(r.first_offset, r.last_offset) for t in got.responses  # type: ignore[attr-defined]
                        for p in t.partitions for r in p.acquired_records]
            assert time.monotonic() - last < PROGRESS_S, "nothing acquired"
        first_offset, last_offset = acquired[0][0], acquired[-1][1]
        assert last_offset - first_offset + 1 == 6, acquired
        # Close the session accepting the first three only.
        closing = ask(78, {**fetch, "share_session_epoch": -1, "topics": [{"topic_id": topic_id, "partitions": [
            {"partition_index": 0, "acknowledgement_batches": [
                {"first_offset": first_offset, "last_offset": first_offset + 2, "acknowledge_types": [1]}]}]}]})
        codes = [p.acknowledge_error_code for t in closing.responses for p in t.partitions]  # type: ignore[attr-defined]
        assert closing.error_code == 0 and codes == [0], closing  # type: ignore[attr-defined]
        ask(76, {"group_id": group, "member_id": member, "member_epoch": -1, "rack_id": None,
                 "subscribed_topic_names": None})
    other = consumer(broker.bootstrap, group, topic)
    try:
        got: set[bytes] = set()
        last = time.monotonic()
        while len(got) < 3:
            fresh = {m.value() for m in other.poll(0.3) if m.error() is None}
            if fresh - got:
                last = time.monotonic()
            got |= fresh
            assert time.monotonic() - last < PROGRESS_S, f"released records never came back: {got}"
        for m in other.poll(1.0):
            got.add(m.value())
        assert got == {b"final-3", b"final-4", b"final-5"}, got  # the accepted three never again
        assert uuid.UUID(str(topic_id))
    finally:
        other.close()
