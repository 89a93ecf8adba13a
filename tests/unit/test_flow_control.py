"""Pausing a flow (mirror/flow_control.py): the control record's codec and its bounds, what a
worker makes of the records it reads (FlowPause), the reader over a fake target partition
(absent topic, re-created topic, refused principal), and the worker's gate on its consumer
(mirror/worker.py FlowWorker)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import trio

from cluster.client.errors import KafkaError
from cluster.client.metadata import PartitionInfo, TopicInfo
from cluster.protocol.errors import ErrorCode
from mirror import flow_control, tail
from mirror.flow_control import (
    FLOW_CONTROL_TOPIC,
    REASON_MAX_CHARS,
    FlowControl,
    FlowControlDenied,
    FlowControlError,
    FlowPause,
)
from mirror.worker import FlowWorker, WorkerConfig

# ---- codec ------------------------------------------------------------------------------


def test_a_control_value_round_trips_and_is_small() -> None:
    c = FlowControl(True, 1_700_000_000_000, "schema change in east ✓")
    assert FlowControl.parse(c.value()) == c
    assert orjson.loads(c.value()) == {"paused": True, "at_ms": 1_700_000_000_000, "reason": "schema change in east ✓"}
    longest = FlowControl(False, 2**53, "é" * REASON_MAX_CHARS)
    assert len(longest.value()) <= flow_control.VALUE_MAX_BYTES
    assert FlowControl.parse(b'{"paused": false, "at_ms": 5}') == FlowControl(False, 5, "")


@pytest.mark.parametrize("value, why", [
    (b"not json", "not JSON"),
    (b"[1, 2]", "must be"),
    (b'{"paused": true}', "must be"),
    (b'{"paused": true, "at_ms": 1, "reason": "", "extra": 1}', "must be"),
    (b'{"paused": "yes", "at_ms": 1}', "paused must be"),
    (b'{"paused": true, "at_ms": -1}', "at_ms"),
    (b'{"paused": true, "at_ms": true}', "at_ms"),
    (b'{"paused": true, "at_ms": 1.5}', "at_ms"),
    (b'{"paused": true, "at_ms": 1, "reason": 7}', "reason"),
    (orjson.dumps({"paused": True, "at_ms": 1, "reason": "x" * (REASON_MAX_CHARS + 1)}), "reason"),
    (b'{"paused": true, "at_ms": 1, "reason": "' + b"x" * 2000 + b'"}', "bytes"),
])
def test_invalid_control_values_are_refused_naming_the_bound(value: bytes, why: str) -> None:
    with pytest.raises(FlowControlError, match=why):
        FlowControl.parse(value)


def test_reasons_and_flow_names_are_bounded() -> None:
    assert flow_control.clean_reason("  two\nlines\t here ") == "two lines here"
    assert flow_control.clean_reason("x" * REASON_MAX_CHARS) == "x" * REASON_MAX_CHARS
    with pytest.raises(FlowControlError, match=f"at most {REASON_MAX_CHARS}"):
        flow_control.clean_reason("x" * (REASON_MAX_CHARS + 1))
    assert flow_control.flow_key("east-to-aggregate") == b"east-to-aggregate"
    for bad in ("", "f" * 250):
        with pytest.raises(FlowControlError, match="flow name"):
            flow_control.flow_key(bad)


def test_the_refusal_names_the_topic_the_cluster_and_the_acl() -> None:
    exc = FlowControlDenied("aggregate", "Write", ErrorCode.topic_authorization_failed, "pausing flow east-to-aggregate")
    text = str(exc)
    for part in ("pausing flow east-to-aggregate", "cluster aggregate", "TOPIC_AUTHORIZATION_FAILED",
                 f"allowing Write on topic {FLOW_CONTROL_TOPIC}", "--operation Write",
                 "--topology-cluster aggregate"):
        assert part in text, (part, text)
    assert isinstance(exc, PermissionError)


# ---- what a worker makes of the records --------------------------------------------------

FLOW = "east-to-aggregate"


def rec(offset: int, value: FlowControl | bytes | None, flow: str = FLOW) -> tuple[int, bytes | None, bytes | None]:
    return offset, flow.encode(), value.value() if isinstance(value, FlowControl) else value


def test_the_last_record_of_the_flow_decides_once_read_to_the_high_watermark() -> None:
    p = FlowPause(FLOW)
    assert not p.paused and p.settle(0) is False
    p.feed([rec(0, FlowControl(True, 100, "first")), rec(1, FlowControl(False, 50, ""), flow="other-flow")], 2)
    assert not p.settle(5), "not read up to the high watermark yet: nothing applied"
    assert not p.paused
    p.feed([rec(2, FlowControl(True, 200, "again")), rec(3, b"{broken")], 5)
    assert p.settle(5) is True and p.paused
    assert p.since_ms == 100, "paused since the record that paused it, not the repeat"
    assert p.control.reason == "again"
    assert p.invalid_records == 1 and "offset 3" in (p.last_invalid or "")
    assert p.status()["paused"] and p.status()["reason"] == "again" and p.status()["since_ms"] == 100
    p.feed([rec(5, FlowControl(False, 300, "done"))], 6)
    assert p.settle(6) is True and not p.paused and p.since_ms is None
    assert p.status()["reason"] is None
    p.feed([rec(6, FlowControl(True, 400, ""))], 7)
    assert p.settle(7) and p.since_ms == 400
    p.feed([rec(7, None)], 8)  # a tombstone: the flow runs
    assert p.settle(8) and not p.paused


def test_an_invalid_record_leaves_the_state_as_it_was() -> None:
    p = FlowPause(FLOW)
    p.feed([rec(0, FlowControl(True, 1, "x")), rec(1, b'{"paused": "no", "at_ms": 2}')], 2)
    assert p.settle(2) and p.paused


def test_records_below_the_position_are_not_read_twice() -> None:
    p = FlowPause(FLOW)
    p.feed([rec(0, FlowControl(True, 1, ""))], 1)
    p.settle(1)
    p.feed([rec(0, FlowControl(False, 1, "")), rec(1, FlowControl(True, 2, "later"))], 2)
    assert not p.settle(2) and p.paused and p.control.reason == "later"


def test_a_replaced_log_is_read_again_before_it_decides() -> None:
    p = FlowPause(FLOW)
    p.feed([rec(0, FlowControl(True, 1, ""))], 1)
    assert p.settle(1) and p.paused
    p.restart(0)
    assert p.paused, "still paused while the new log is read"
    p.feed([rec(0, FlowControl(True, 9, "kept"))], 1)
    assert not p.settle(3) and p.paused
    p.feed([], 3)
    assert not p.settle(3) and p.paused and p.control.reason == "kept"
    p.restart(0)
    p.feed([], 2)
    assert p.settle(2) and not p.paused, "a log without the flow's record: it runs"


# ---- the reader over a fake partition ----------------------------------------------------


@dataclass
class FakeMetadata:
    topics: dict[str, TopicInfo] = field(default_factory=dict)

    def partition_count(self, topic: str) -> int | None:
        info = self.topics.get(topic)
        return len(info.partitions) if info is not None and info.error_code == 0 and info.partitions else None

    def topic_id(self, topic: str) -> uuid.UUID | None:
        info = self.topics.get(topic)
        return info.topic_id if info is not None and info.error_code == 0 else None


class FakeTarget:
    """The target cluster as the reader sees it: the control topic's one partition (a list of
    (offset, key, value); None: no such topic), its log start, its incarnation, and an error
    every request answers (a principal without the ACL)."""

    def __init__(self) -> None:
        self.metadata = FakeMetadata()
        self.log: list[tuple[int, bytes | None, bytes | None]] | None = None
        self.log_start = 0
        self.topic_id = uuid.uuid4()
        self.denied = False
        self.fetches = 0

    async def refresh(self, topics: set[str] | None = None) -> FakeMetadata:
        if self.denied:
            info = TopicInfo(FLOW_CONTROL_TOPIC, ErrorCode.topic_authorization_failed)
        elif self.log is None:
            info = TopicInfo(FLOW_CONTROL_TOPIC, ErrorCode.unknown_topic_or_partition)
        else:
            info = TopicInfo(FLOW_CONTROL_TOPIC, 0, {0: PartitionInfo(FLOW_CONTROL_TOPIC, 0, 1, 0, [1], [1])},
                             topic_id=self.topic_id)
        self.metadata.topics[FLOW_CONTROL_TOPIC] = info
        return self.metadata

    def recreate(self, records: list[tuple[int, bytes | None, bytes | None]]) -> None:
        self.log, self.topic_id, self.log_start = records, uuid.uuid4(), 0


def install(monkeypatch: pytest.MonkeyPatch, target: FakeTarget, batch_records: int = 2) -> None:
    """tail.fetch / tail.offsets answered from `target` (`batch_records` records per batch, at
    most two batches per answer: reading takes several fetches)."""

    @dataclass
    class Header:
        base_offset: int
        last_offset_delta: int

    @dataclass
    class Rec:
        offset: int
        key: bytes | None
        value: bytes | None

    async def fetch(cluster: Any, topic: str, partition: int, offset: int, **_: Any) -> tail.Fetched:
        assert cluster is target and topic == FLOW_CONTROL_TOPIC and partition == 0
        target.fetches += 1
        await refresh_if_replaced()
        if target.denied:
            raise KafkaError("fetch", ErrorCode.topic_authorization_failed)
        assert target.log is not None
        hw = target.log[-1][0] + 1 if target.log else target.log_start
        if offset > hw or offset < target.log_start:
            raise KafkaError("fetch", ErrorCode.offset_out_of_range)
        rows = [r for r in target.log if r[0] >= offset][:2 * batch_records]
        batches = [tail.Batch(Header(chunk[0][0], chunk[-1][0] - chunk[0][0]),  # type: ignore[arg-type]
                              [Rec(*r) for r in chunk])  # type: ignore[misc]
                   for chunk in (rows[i:i + batch_records] for i in range(0, len(rows), batch_records))]
        return tail.Fetched(batches, hw, target.log_start)

    async def refresh_if_replaced() -> None:
        info = target.metadata.topics.get(FLOW_CONTROL_TOPIC)
        if info is not None and info.topic_id != target.topic_id:
            await target.refresh()

    async def offsets(cluster: Any, topic: str, partition: int) -> tuple[int, int]:
        assert target.log is not None
        return target.log_start, target.log[-1][0] + 1 if target.log else target.log_start

    monkeypatch.setattr(tail, "fetch", fetch)
    monkeypatch.setattr(tail, "offsets", offsets)


def poll(target: FakeTarget, pause: FlowPause) -> bool:
    return trio.run(lambda: flow_control.poll(target, pause, cluster_name="aggregate"))  # type: ignore[arg-type]


def test_the_reader_follows_the_topic_through_absence_and_re_creation(monkeypatch: pytest.MonkeyPatch) -> None:
    target = FakeTarget()
    install(monkeypatch, target)
    pause = FlowPause(FLOW)
    assert poll(target, pause) is False and not pause.paused, "no topic: no control record, the flow runs"
    target.recreate([rec(i, FlowControl(i % 2 == 0, i, f"r{i}"), flow="other" if i < 8 else FLOW)
                     for i in range(11)])
    target.metadata.topics.clear()
    assert poll(target, pause) is True and pause.paused and pause.control.reason == "r10"
    assert pause.next_offset == 11 and target.fetches >= 3, "read in several fetches"
    before = target.fetches
    assert poll(target, pause) is False and target.fetches == before + 1, "nothing new: one fetch"
    target.log.append(rec(11, FlowControl(False, 11, "")))  # type: ignore[union-attr]
    assert poll(target, pause) is True and not pause.paused
    # Deleted and created again, shorter than the position: read from its start.
    target.recreate([rec(0, FlowControl(True, 20, "new log"))])
    assert poll(target, pause) is True and pause.paused and pause.control.reason == "new log"
    # Created again, longer than the position (no out-of-range answer): the topic id tells.
    target.recreate([rec(i, FlowControl(False, 30 + i, ""), flow="other") for i in range(5)])
    assert poll(target, pause) is True and not pause.paused


def test_a_paused_flow_stays_paused_while_the_topic_seems_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    target = FakeTarget()
    install(monkeypatch, target)
    target.log = [rec(0, FlowControl(True, 1, "held"))]
    pause = FlowPause(FLOW)
    assert poll(target, pause) and pause.paused
    target.log = None  # deleted, or a broker that does not know it yet
    target.metadata.topics.clear()
    with pytest.raises(KafkaError, match="stays paused"):
        poll(target, pause)
    assert pause.paused
    target.recreate([rec(0, FlowControl(False, 2, ""))])  # what `mirror resume` writes
    assert poll(target, pause) and not pause.paused


def test_the_reader_says_which_acl_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    target = FakeTarget()
    install(monkeypatch, target)
    target.denied = True
    with pytest.raises(FlowControlDenied, match=f"allowing Read on topic {FLOW_CONTROL_TOPIC}") as exc:
        poll(target, FlowPause(FLOW))
    assert "cluster aggregate" in str(exc.value)
    target.denied, target.log = False, [rec(0, FlowControl(True, 1, ""))]
    pause = FlowPause(FLOW)
    assert poll(target, pause) and pause.paused
    target.denied = True  # the ACL removed later: the fetch is refused
    with pytest.raises(FlowControlDenied, match="TOPIC_AUTHORIZATION_FAILED"):
        poll(target, pause)
    assert pause.paused, "a refused read changes nothing"


# ---- the worker's gate on its consumer ---------------------------------------------------


class FakeConsumer:
    def __init__(self, assigned: list[tuple[str, int]]) -> None:
        self.assigned = set(assigned)
        self.paused: set[tuple[str, int]] = set(assigned)  # as _on_assign leaves them

    def assignment(self) -> set[tuple[str, int]]:
        return set(self.assigned)

    def pause(self, *tps: tuple[str, int]) -> None:
        self.paused |= set(tps)

    def resume(self, *tps: tuple[str, int]) -> None:
        assert set(tps) <= self.assigned
        self.paused -= set(tps)


class GateWorker(FlowWorker):
    def __init__(self, claimed: list[tuple[str, int]], assigned: list[tuple[str, int]]) -> None:
        self.config = WorkerConfig()
        self.name = "w0"
        self.flow = type("Flow", (), {"name": FLOW, "source": "east", "target": "aggregate"})()  # type: ignore[assignment]
        self.claimed = claimed
        self._consumer = FakeConsumer(assigned)  # type: ignore[assignment]
        self.flow_pause = FlowPause(FLOW)

    def _claimed(self) -> list[tuple[str, int]]:
        return list(self.claimed)


def set_state(w: GateWorker, paused: bool, at_ms: int) -> None:
    p = w.flow_pause
    p.feed([rec(p.next_offset, FlowControl(paused, at_ms, "maintenance" if paused else ""))], p.next_offset + 1)
    if p.settle(p.next_offset):
        w._apply_pause()


def test_pause_stops_every_assigned_partition_and_resume_only_the_claimed_ones() -> None:
    a, b, c = ("pv", 0), ("pv", 1), ("pv", 2)
    w = GateWorker(claimed=[a, b], assigned=[a, b, c])
    consumer: FakeConsumer = w._consumer  # type: ignore[assignment]
    w._resume_fetching(a)
    w._resume_fetching(b)
    assert consumer.paused == {c}, "c is being claimed: still paused"
    set_state(w, True, 100)
    assert consumer.paused == {a, b, c}
    w._resume_fetching(c)  # c's claim finishes while the flow is paused
    assert consumer.paused == {a, b, c}, "claimed while paused: stays paused"
    w.claimed.append(c)
    st = w.pause_status()
    assert st["paused"] and st["paused_since_ms"] == 100 and st["pause_reason"] == "maintenance"
    set_state(w, False, 200)
    assert consumer.paused == set()
    assert not w.pause_status()["paused"]


def test_resume_leaves_partitions_not_claimed_paused() -> None:
    a, b = ("pv", 0), ("pv", 1)
    w = GateWorker(claimed=[a], assigned=[a, b])
    set_state(w, True, 1)
    w.claimed.append(("pv", 9))  # claimed, then revoked: no longer assigned
    set_state(w, False, 2)
    assert w._consumer.paused == {b}  # type: ignore[union-attr]
