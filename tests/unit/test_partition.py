"""The sans-IO Partition (cluster/replication/partition.py) as plain calls on a real log."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.protocol.errors import ErrorCode
from cluster.replication.partition import AlterIsr, IsrAnswer, Partition, PartitionRole, isr_answer
from cluster.storage.config import LogConfig
from cluster.storage.log import Log, NotEnoughReplicas
from tests.batches import values_batch

NOW = 1_700_000_000_000


def leader(tmp_path: Path, isr: tuple[int, ...] = (1, 2, 3), min_isr: int = 2) -> Partition:
    lg = Log.create(tmp_path / "t-0", "t", 0, LogConfig.build({"min.insync.replicas": str(min_isr)}), NOW)
    part = Partition("t", 0, lg, "topic-id", local_id=1)
    part.apply_role(PartitionRole(1, 5, 10, (1, 2, 3), isr), NOW)
    return part


def append(part: Partition, n: int = 1, *, acks_all: bool = True) -> int:
    return part.append_as_leader(values_batch([b"v"] * n), min_isr_checked=acks_all, now_ms=NOW).base_offset


def test_the_high_watermark_is_the_slowest_in_sync_log_end_and_never_moves_back(tmp_path: Path) -> None:
    part = leader(tmp_path)
    append(part, 4)
    assert part.high_watermark == 0
    assert part.on_follower_fetch(2, 4, NOW).high_watermark_moved is False  # 3 has nothing yet
    assert part.on_follower_fetch(3, 3, NOW).high_watermark_moved and part.high_watermark == 3
    part.on_follower_fetch(3, 1, NOW)  # a follower that truncated reports less: the HW stays
    assert part.high_watermark == 3
    assert part.acks_all_outcome(3) == ErrorCode.none and part.acks_all_outcome(4) is None


def test_a_member_being_added_counts_at_once_and_a_shrink_only_once_committed(tmp_path: Path) -> None:
    part = leader(tmp_path, isr=(1, 2), min_isr=1)
    append(part, 2)
    part.on_follower_fetch(2, 2, NOW)
    assert part.high_watermark == 2
    append(part, 2)  # offsets 2, 3
    change = part.on_follower_fetch(3, 4, NOW).alter_isr  # 3 caught up with the log end
    assert change == AlterIsr("t", 0, "topic-id", 5, 10, (1, 2, 3), "expand with 3")
    assert part.maximal_isr == (1, 2, 3)
    part.on_follower_fetch(2, 3, NOW)
    # 2 is at 3, 3 at 4: without the maximal ISR the HW would be 3 too; with 3 pending, the
    # slowest of {1, 2, 3} is still 3 -- and once 3 stops, the HW waits for it.
    assert part.high_watermark == 3
    append(part, 1)  # offset 4
    part.on_follower_fetch(2, 5, NOW)
    assert part.high_watermark == 4, "the HW must wait for 3, whose addition may have committed"
    # A shrink decided by the leader does not lower what the HW waits for until committed.
    shrink_part = leader(tmp_path / "b", isr=(1, 2, 3), min_isr=1)
    append(shrink_part, 1)
    shrink = shrink_part.maybe_shrink_isr(NOW + 60_000, 30_000)
    assert shrink is not None and shrink.isr == (1,)
    assert shrink_part.maximal_isr == (1, 2, 3) and shrink_part.high_watermark == 0


@pytest.mark.parametrize(("answer", "pending_after", "resend"), [
    (IsrAnswer.COMMITTED, None, False),
    (IsrAnswer.REFUSED, None, False),
    (IsrAnswer.STALE, (1, 2, 3), False),  # about an older epoch: newer metadata settles it
    (IsrAnswer.UNKNOWN, (1, 2, 3), True),  # no answer: it may be in; sent again
])
def test_an_isr_change_keeps_counting_until_its_outcome_is_known(
        tmp_path: Path, answer: IsrAnswer, pending_after: tuple[int, ...] | None, resend: bool) -> None:
    part = leader(tmp_path, isr=(1, 2), min_isr=1)
    append(part, 1)
    change = part.on_follower_fetch(3, 1, NOW).alter_isr
    assert change is not None and part.isr_change_pending
    assert part.isr_change_answered(change, answer, NOW) is resend
    assert part.pending_isr == pending_after
    # Metadata with a newer partition epoch always settles it.
    part.apply_role(PartitionRole(1, 5, 11, (1, 2, 3), (1, 2)), NOW)
    assert part.pending_isr is None and not part.isr_change_pending
    assert part.isr_change_answered(change, IsrAnswer.UNKNOWN, NOW) is False  # a late answer changes nothing


def test_controller_errors_map_to_outcomes() -> None:
    assert isr_answer(ErrorCode.none) is IsrAnswer.COMMITTED
    assert isr_answer(ErrorCode.ineligible_replica) is IsrAnswer.REFUSED
    assert isr_answer(ErrorCode.invalid_update_version) is IsrAnswer.STALE
    assert isr_answer(ErrorCode.request_timed_out) is IsrAnswer.UNKNOWN
    assert isr_answer(ErrorCode.unknown_server_error) is IsrAnswer.UNKNOWN  # unknown means unknown


def test_acks_all_below_min_insync_replicas(tmp_path: Path) -> None:
    part = leader(tmp_path, isr=(1,), min_isr=2)
    with pytest.raises(NotEnoughReplicas):
        append(part)
    assert append(part, acks_all=False) == 0  # acks=1 still appends
    assert part.acks_all_outcome(1) == ErrorCode.not_enough_replicas_after_append
    part.apply_role(PartitionRole(2, 6, 12, (1, 2, 3), (2, 1)), NOW)  # leadership moved
    assert part.acks_all_outcome(1) == ErrorCode.not_leader_or_follower
    assert part.follower is not None and part.follower.leader_id == 2 and part.needs_truncation


def test_a_follower_truncates_where_its_history_leaves_the_leaders(tmp_path: Path) -> None:
    lg = Log.create(tmp_path / "t-0", "t", 0, LogConfig.build({}), NOW)
    part = Partition("t", 0, lg, "id", local_id=2)
    part.apply_role(PartitionRole(2, 3, 1, (1, 2), (1, 2)), NOW)  # led epoch 3 for a while
    for _ in range(3):
        append(part, 1, acks_all=False)  # batches at offsets 0, 1, 2
    part.apply_role(PartitionRole(1, 4, 2, (1, 2), (1, 2)), NOW)  # now 1 leads, epoch 4
    assert part.needs_truncation and not part.fetching
    # The leader says epoch 3 ended at offset 1 on its side: our offsets 1, 2 diverged.
    cut = part.truncate_to_leader(3, 1, NOW)
    assert cut is not None and (cut.before, cut.after) == (3, 1) and part.fetching
    outcome = part.handle_fetch_answer(ErrorCode.none, b"", 1, 0, NOW)
    assert outcome.appended == 0 and not outcome.retry and part.high_watermark == 1
    assert part.handle_fetch_answer(ErrorCode.not_leader_or_follower, b"", -1, -1, NOW).retry


def test_reads_end_at_the_high_watermark_for_consumers_and_the_log_end_for_followers(tmp_path: Path) -> None:
    part = leader(tmp_path, isr=(1, 2), min_isr=1)
    append(part, 2)
    consumer = part.read_records(0, 1 << 20, replica_id=-1, current_leader_epoch=5, min_one_batch=True, now_ms=NOW)
    assert consumer.error == ErrorCode.none and consumer.records == b"" and consumer.high_watermark == 0
    follower = part.read_records(0, 1 << 20, replica_id=2, current_leader_epoch=5, min_one_batch=True, now_ms=NOW)
    assert follower.records and follower.follower is not None
    fenced = part.read_records(0, 100, replica_id=-1, current_leader_epoch=4, min_one_batch=True, now_ms=NOW)
    assert fenced.error == ErrorCode.fenced_leader_epoch
    stranger = part.read_records(0, 100, replica_id=7, current_leader_epoch=-1, min_one_batch=True, now_ms=NOW)
    assert stranger.error == ErrorCode.not_leader_or_follower


# ---- KIP-392: fetch from follower ------------------------------------------------------

RACKS = {1: "east", 2: "central", 3: "central"}


def test_the_rack_aware_selector_picks_as_kafkas() -> None:
    from cluster.replication.replica_selector import ReplicaView, rack_aware_select
    lead = ReplicaView(1, "east", 100, 0)
    two, three = ReplicaView(2, "central", 90, 0), ReplicaView(3, "central", 100, 500)
    assert rack_aware_select("", lead, [two, three]) == 1  # no rack: the leader
    assert rack_aware_select("west", lead, [two, three]) == 1  # nobody in the rack: the leader
    assert rack_aware_select("east", lead, [two, three]) == 1  # the leader is in the rack
    assert rack_aware_select("central", lead, [two, three]) == 3  # the most caught up
    assert rack_aware_select("central", lead, [ReplicaView(2, "central", 100, 10), three]) == 2  # caught up latest


def test_a_leader_sends_a_consumer_to_an_in_sync_follower_of_its_rack_that_holds_the_offset(tmp_path: Path) -> None:
    part = leader(tmp_path)
    append(part, 10)
    part.on_follower_fetch(2, 6, NOW, log_start=0)
    part.on_follower_fetch(3, 10, NOW, log_start=0)
    rack = RACKS.get
    assert part.preferred_read_replica("central", 5, NOW, rack) == 3
    assert part.preferred_read_replica("east", 5, NOW, rack) == -1  # the leader's own rack
    assert part.preferred_read_replica("", 5, NOW, rack) == -1
    part.on_follower_fetch(3, 4, NOW)  # 3 truncated: it no longer holds offset 5
    assert part.preferred_read_replica("central", 5, NOW, rack) == 2
    part.apply_role(PartitionRole(1, 5, 11, (1, 2, 3), (1, 3)), NOW)  # 2 left the ISR
    assert part.preferred_read_replica("central", 5, NOW, rack) == -1


def test_a_follower_serves_a_v11_consumer_up_to_the_high_watermark_it_learned(tmp_path: Path) -> None:
    lg = Log.create(tmp_path / "t-0", "t", 0, LogConfig.build({}), NOW)
    part = Partition("t", 0, lg, "topic-id", local_id=2)
    part.apply_role(PartitionRole(1, 5, 10, (1, 2, 3), (1, 2, 3)), NOW)
    part.append_fetched(values_batch([b"a", b"b", b"c"]), leader_high_watermark=2, now_ms=NOW)
    old = part.read_records(0, 1 << 20, replica_id=-1, current_leader_epoch=-1, min_one_batch=True, now_ms=NOW)
    assert old.error == ErrorCode.not_leader_or_follower  # Fetch before v11: leaders only
    served = part.read_records(0, 1 << 20, replica_id=-1, current_leader_epoch=5, min_one_batch=True, now_ms=NOW,
                               follower_read=True)
    assert served.error == ErrorCode.none and served.high_watermark == 2
    assert served.records == b""  # the one batch ends at 3, above the high watermark 2
    part.append_fetched(b"", leader_high_watermark=3, now_ms=NOW)
    served = part.read_records(0, 1 << 20, replica_id=-1, current_leader_epoch=5, min_one_batch=True, now_ms=NOW,
                               follower_read=True)
    assert served.error == ErrorCode.none and len(served.records) > 0
    stale = part.read_records(0, 1 << 20, replica_id=-1, current_leader_epoch=4, min_one_batch=True, now_ms=NOW,
                              follower_read=True)
    assert stale.error == ErrorCode.fenced_leader_epoch


def test_a_new_follower_starts_its_log_inside_the_leaders_first_batch(tmp_path: Path) -> None:
    """A replica added by a reassignment after DeleteRecords moved the leader's log start into
    a batch (offsets 0..4, log start 3): the leader sends that whole batch; the empty follower
    log starts at the batch's base and then follows the leader's log start (Kafka's
    appendRecordsToFollowerOrFutureReplica). The old way refused the batch forever."""
    lg = Log.create(tmp_path / "t-0", "t", 0, LogConfig.build({}), NOW)
    part = Partition("t", 0, lg, "topic-id", local_id=2)
    part.apply_role(PartitionRole(1, 5, 10, (1, 2), (1,)), NOW)
    assert part.handle_fetch_answer(ErrorCode.offset_out_of_range, b"", 5, 3, NOW).restarted_at == 3
    outcome = part.handle_fetch_answer(ErrorCode.none, values_batch([b"v"] * 5), 5, 3, NOW)
    assert outcome.problem is None and outcome.appended == 5 and outcome.log_start_moved
    assert (lg.log_start_offset, lg.log_end_offset, part.high_watermark) == (3, 5, 5)
    # a batch that does not continue a non-empty log is still refused
    refused = part.handle_fetch_answer(ErrorCode.none, values_batch([b"w"] * 2), 5, 3, NOW)
    assert refused.retry and refused.problem is not None and lg.log_end_offset == 5


def test_a_follower_takes_gaps_and_still_starts_inside_a_batch_after_delete_records(tmp_path: Path) -> None:
    # Followers take gaps (a mirror topic's copy of a compacted source); the DeleteRecords
    # case stays: an empty log whose start lies inside the leader's first batch starts at it.
    lg = Log.create(tmp_path / "t-0", "t", 0, LogConfig.build({}), NOW)
    part = Partition("t", 0, lg, "topic-id", local_id=2)
    part.apply_role(PartitionRole(1, 5, 10, (1, 2, 3), (1, 2, 3)), NOW)
    lg.truncate_fully_and_start_at(2, NOW)
    assert part.append_fetched(values_batch([b"a", b"b", b"c"], base_offset=1), leader_high_watermark=4,
                               now_ms=NOW) == 3
    assert (lg.log_start_offset, lg.log_end_offset) == (1, 4)
    assert part.append_fetched(values_batch([b"d"], base_offset=9), leader_high_watermark=10, now_ms=NOW) == 6
    assert lg.log_end_offset == 10 and part.high_watermark == 10


@pytest.mark.parametrize("strict", [False, True])
def test_strict_min_isr_holds_the_high_watermark_while_the_isr_is_short(tmp_path: Path, strict: bool) -> None:
    """KIP-966: with ELR on, the high watermark does not advance while the ISR is below
    min.insync.replicas (what makes the replicas that left eligible); without, it follows the
    ISR alone (and the last ISR member may be the only copy of what it acknowledged)."""
    part = leader(tmp_path, isr=(1, 2, 3), min_isr=2)
    part.apply_role(PartitionRole(1, 5, 11, (1, 2, 3), (1, 2, 3), strict), NOW)
    append(part, 2)
    part.on_follower_fetch(2, 2, NOW)
    part.on_follower_fetch(3, 2, NOW)
    assert part.high_watermark == 2
    append(part, 3, acks_all=False)  # acks=1 while the ISR is whole; then both followers leave
    part.apply_role(PartitionRole(1, 5, 12, (1, 2, 3), (1,), strict), NOW)
    assert part.under_min_isr
    if strict:
        assert part.high_watermark == 2  # stands still: 2 and 3 hold everything below it
        assert part.acks_all_outcome(5) == ErrorCode.not_enough_replicas_after_append  # answered, not timed out
    else:
        assert part.high_watermark == 5
    # min ISR 1 (capped by nothing) or an ISR back at min ISR lets it move again.
    part.apply_role(PartitionRole(1, 5, 13, (1, 2, 3), (1, 2), strict), NOW)
    part.on_follower_fetch(2, 5, NOW)
    assert part.high_watermark == 5


def test_strict_min_isr_is_capped_by_the_replica_count(tmp_path: Path) -> None:
    """A topic with fewer replicas than min.insync.replicas still advances (Kafka's effective
    min ISR); acks=all is refused there as Kafka refuses it."""
    lg = Log.create(tmp_path / "one-0", "one", 0, LogConfig.build({"min.insync.replicas": "2"}), NOW)
    part = Partition("one", 0, lg, "topic-id", local_id=1)
    part.apply_role(PartitionRole(1, 0, 0, (1,), (1,), True), NOW)
    assert not part.under_min_isr
    part.append_as_leader(values_batch([b"v"] * 3), min_isr_checked=False, now_ms=NOW)
    assert part.high_watermark == 3


def test_a_new_leader_whose_high_watermark_lags_its_epoch_start_says_so(tmp_path: Path) -> None:
    """Kafka's OFFSET_NOT_AVAILABLE window (KIP-207): a replica that becomes leader knows the
    old leader's high watermark only one fetch late; until its own passes the offset its
    epoch started at, a client's latest offset from it could go backwards."""
    lg = Log.create(tmp_path / "t-0", "t", 0, LogConfig.build({}), NOW)
    part = Partition("t", 0, lg, "id", local_id=2)
    part.apply_role(PartitionRole(2, 3, 1, (1, 2), (1, 2)), NOW)
    for _ in range(3):
        append(part, 1, acks_all=False)  # offsets 0, 1, 2
    part.on_follower_fetch(1, 1, NOW)
    assert part.high_watermark == 1 and not part.high_watermark_lags_epoch_start
    part.apply_role(PartitionRole(1, 4, 2, (1, 2), (1, 2)), NOW)  # a follower for a while
    assert not part.high_watermark_lags_epoch_start
    part.apply_role(PartitionRole(2, 5, 3, (1, 2), (1, 2)), NOW)  # leads again: epoch 5 starts at 3
    assert part.high_watermark == 1 and part.high_watermark_lags_epoch_start
    part.on_follower_fetch(1, 2, NOW)
    assert part.high_watermark == 2 and part.high_watermark_lags_epoch_start
    part.on_follower_fetch(1, 3, NOW)
    assert part.high_watermark == 3 and not part.high_watermark_lags_epoch_start
