"""The record-copying flow's partition decisions (mirror/core/record_copy.py), as plain calls:
what acknowledgements and failed deliveries do, which chunk may be copied, holes, claims,
records too large, copies of copies."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from cluster.protocol.errors import ErrorCode
from mirror.core import record_copy
from mirror.core.record_copy import DONE, PartitionMirror
from mirror.history import Divergence, MirroredPosition, Resume
from topology.model import MirrorSpec

TP = ("orders", 0)
ID, OTHER_ID = uuid.uuid4(), uuid.uuid4()


@dataclass
class Delivered:
    done: bool = True
    error: Exception | None = None


class Refused(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"error {code}")
        self.code = code


def partition(next_offset: int = 10) -> PartitionMirror:
    pm = PartitionMirror(TP, ("east.orders", 0), next_offset=next_offset, acked_offset=next_offset - 1)
    pm.history.reset(ID, 3)
    return pm


def test_acknowledgements_move_in_offset_order_and_stop_at_the_first_not_done() -> None:
    pm = partition()
    later = Delivered(done=False)
    pm.pending += [(10, Delivered(), False), (12, later, False), (13, Delivered(), False)]
    assert pm.settle().advanced and pm.acked_offset == 10 and len(pm.pending) == 2
    assert not pm.settle().advanced  # 12 is not done: 13 waits behind it
    later.done = True
    assert pm.settle().advanced and pm.acked_offset == 13 and not pm.pending
    assert pm.commit_offset() == 14
    pm.committed_offset = 14
    assert pm.commit_offset() is None
    assert pm.acknowledged() == (ID, 3, 14)


def test_a_failed_delivery_breaks_the_partition_and_a_size_refusal_is_counted() -> None:
    pm = partition()
    pm.pending += [(10, Delivered(error=Refused(ErrorCode.message_too_large)), True), (11, Delivered(), False)]
    settled = pm.settle()
    assert not settled.advanced and not settled.fenced and pm.broken and "delivery failed" in pm.broken
    assert pm.pending == [] and pm.refused[10][1] == 1 and pm.acked_offset == 9
    assert not record_copy.dead_letter_refused(pm.refused[10])
    pm.broken = None
    pm.pending.append((10, Delivered(error=Refused(ErrorCode.message_too_large)), True))
    pm.settle()
    assert record_copy.dead_letter_refused(pm.refused[10])  # the second time: dead-lettered
    pm.pending.append((10, Delivered(error=Refused(ErrorCode.producer_fenced)), False))
    assert pm.settle().fenced


def test_chunks_of_another_incarnation_or_behind_the_position_are_refused() -> None:
    pm = partition()
    assert pm.refusal(10, ID) is None and pm.refusal(12, None) is None
    assert "topic id" in (pm.refusal(10, OTHER_ID) or "")
    assert "position reset" in (pm.refusal(9, ID) or "")


def test_markers_passed_over_are_done_once_everything_before_them_is() -> None:
    pm = partition()
    pending = Delivered(done=False)
    pm.pending.append((10, pending, False))
    assert pm.passed_to(14) and pm.next_offset == 14 and pm.pending[-1] == (13, DONE, False)
    assert not pm.passed_to(12)
    assert not pm.settle().advanced
    pending.done = True
    assert pm.settle().advanced and pm.acked_offset == 13
    pm.broken = "claim again"
    assert not pm.passed_to(20) and pm.next_offset == 14  # not copying: left for the claim


def test_a_hole_fills_up_to_what_the_target_holds_then_goes_on_after_the_tail() -> None:
    pm = partition(0)
    assert pm.fill_step([0, 1]) is None
    pm.fill_until = (5, 40)
    step = pm.fill_step([0, 1, 2])
    assert step is not None and (step.keep, step.filled) == (3, False)
    step = pm.fill_step([3, 4, 5, 6])
    assert step is not None and (step.keep, step.filled, step.go_on) == (2, True, 40)
    tail = MirroredPosition(39, ID, 3)
    assert record_copy.hole(5, 0, 0, tail) == (5, 40)
    assert record_copy.hole(5, 5, 5, tail) is None  # nothing below the first mirrored record
    assert record_copy.hole(5, 0, 7, tail) is None  # compaction left the source nothing there
    assert record_copy.hole(5, 0, None, tail) is None


def test_a_claim_plan_resumes_stops_or_fills() -> None:
    tail = MirroredPosition(39, ID, 3)
    same = Resume(40, 3)
    plan = record_copy.ClaimPlan.of(tail, same, None, 0, "orders", ID, "mirror")
    assert (plan.resume, plan.fill_until, plan.stop, plan.last_epoch, plan.keep_epoch_starts) == (40, None, None, 3,
                                                                                                   True)
    filling = record_copy.ClaimPlan.of(tail, same, (5, 40), 2, "orders", ID, "mirror")
    assert (filling.resume, filling.fill_until, filling.last_epoch, filling.keep_epoch_starts) == (2, (5, 40), -1,
                                                                                                   False)
    recreated = Resume(0, -1, new_incarnation=True)
    assert record_copy.ClaimPlan.of(tail, recreated, None, 0, "orders", OTHER_ID, "mirror").stop is None
    stopped = record_copy.ClaimPlan.of(tail, recreated, None, 0, "orders", OTHER_ID, "stop")
    assert stopped.stop is not None and "on.topic.recreated = stop" in stopped.stop
    assert not record_copy.needs_hole_check(tail, recreated) and record_copy.needs_hole_check(tail, same)


def test_a_target_holding_less_than_it_acknowledged_is_refilled() -> None:
    acknowledged = (ID, 3, 50)
    assert record_copy.claim_findings(MirroredPosition(39, ID, 3), Resume(40, 3), acknowledged, None).refill
    assert not record_copy.claim_findings(MirroredPosition(49, ID, 3), Resume(50, 3), acknowledged, None).refill
    # A divergence at the source explains it: not the target's loss.
    diverged = Resume(30, 2, divergence=Divergence(30, 39, 3, 2))
    assert not record_copy.claim_findings(MirroredPosition(39, ID, 3), diverged, acknowledged, None).refill
    assert record_copy.claim_findings(None, Resume(0, -1), acknowledged, None).refill
    assert record_copy.target_lost_acknowledged(MirroredPosition(39, ID, 3), acknowledged)
    assert not record_copy.target_lost_acknowledged(MirroredPosition(39, OTHER_ID, 0), acknowledged)
    assert not record_copy.target_lost_acknowledged(None, None)


def test_record_limits_leave_room_for_the_batch_the_request_and_the_provenance() -> None:
    record_max, tagged_max = record_copy.record_limits(1_000_000, 2_000_000, 104_857_600, 120)
    assert record_max == 1_000_000 - record_copy.BATCH_FRAMING_BYTES and tagged_max == record_max - 120
    # The brokers' request limit below the topic's: that one bounds.
    assert record_copy.record_limits(None, 2_000_000, 500_000, 0)[0] == \
        500_000 - record_copy.REQUEST_FRAMING_BYTES - record_copy.BATCH_FRAMING_BYTES


def test_a_copy_of_a_copy_is_not_mirrored_back() -> None:
    from topology.load import loads

    topology = loads("""
[clusters.east]
datacenter = "east"
brokers = ["127.0.0.1:19092"]
[clusters.west]
datacenter = "west"
brokers = ["127.0.0.1:29092"]
[[mirrors]]
source = "east"
target = "west"
topics = ".*"
[[mirrors]]
source = "west"
target = "east"
topics = ".*"
""")
    back: MirrorSpec = next(m for m in topology.mirrors if m.source == "west")
    assert record_copy.is_copy_from_target(topology, back, "east.orders")
    assert not record_copy.is_copy_from_target(topology, back, "orders")
