"""The share-group offset decisions without I/O (cluster/groups/share_group_offsets.py): the
lag, the state epoch an alter initializes with, which share partitions a heartbeat must
initialize first, what a describe answers per share partition; the settled-record count the
share coordinator's summary answers; the FindCoordinator SHARE key; sessions in use."""

from __future__ import annotations

import base64
import uuid

from cluster.groups.share_group_offsets import (
    DescribedPartition,
    alter_state_epoch,
    described,
    share_lag,
    uninitialized,
)
from cluster.groups.share_partition import RecordState, StateBatch
from cluster.groups.share_session import ShareSessionCache
from cluster.groups.share_state_records import ShareStateValue, delivery_complete_count
from cluster.groups.share_state_service import ShareStateService
from cluster.protocol.errors import ErrorCode

ACK, ARC, AVA = RecordState.ACKNOWLEDGED, RecordState.ARCHIVED, RecordState.AVAILABLE


def test_lag_is_the_unsettled_records_up_to_the_high_watermark() -> None:
    assert share_lag(10, 10, 0) == 0
    assert share_lag(10, 0, 0) == 10
    assert share_lag(20, 5, 3) == 12  # 3 of 15 in flight settled
    assert share_lag(10, -1, 0) == -1  # not started
    assert share_lag(10, 4, -1) == -1  # settled count not known
    assert share_lag(3, 5, 0) == -2  # as Kafka: an offset altered past the end is not clamped


def test_settled_records_are_counted_from_the_start_offset() -> None:
    state = ShareStateValue(1, 0, 5, (StateBatch(3, 6, ACK, 1), StateBatch(7, 8, AVA, 2), StateBatch(9, 9, ARC, 5)))
    assert delivery_complete_count(state) == 3  # 5, 6 and 9 (3 and 4 are below the start)
    assert delivery_complete_count(ShareStateValue(1, 0, -1)) == -1
    assert delivery_complete_count(ShareStateValue(1, 0, 7)) == 0


def test_an_alter_bumps_the_state_epoch_above_the_stored_one() -> None:
    assert alter_state_epoch(4, None) == 4  # nothing stored: the group epoch
    assert alter_state_epoch(4, 2) == 4
    assert alter_state_epoch(0, 3) == 4  # a group epoch that started again: still above, so the old leader is fenced
    assert alter_state_epoch(4, 4) == 5


def test_a_heartbeat_initializes_only_what_the_group_has_not() -> None:
    assert uninitialized({}, {"t": 3}) == {"t": {0, 1, 2}}
    assert uninitialized({"t": {0, 1, 2}}, {"t": 3}) == {}
    assert uninitialized({"t": {0, 1}}, {"t": 4, "u": 1}) == {"t": {2, 3}, "u": {0}}  # a topic grew, a new one


def test_describe_answers_per_share_partition_as_kafka() -> None:
    hw = (ErrorCode.none, 30)
    assert described(0, ErrorCode.none, 10, 3, 5, hw) == DescribedPartition(0, 10, 3, 15)
    # the share coordinator's error is absence of data, not an error (as OffsetFetch)
    assert described(1, ErrorCode.coordinator_not_available, 10, 3, 5, None) == DescribedPartition(1, -1, 0, -1)
    # initialized, not started: no lag
    assert described(2, ErrorCode.none, -1, 0, -1, None) == DescribedPartition(2, -1, 0, -1)
    # the leader could not say its high watermark: the partition's error
    failed = described(3, ErrorCode.none, 10, 3, 5, (ErrorCode.not_leader_or_follower, -1))
    assert (failed.start_offset, failed.lag, failed.error_code) == (-1, -1, ErrorCode.not_leader_or_follower)
    assert described(5, ErrorCode.none, 10, 3, 5, None).error_code == ErrorCode.leader_not_available
    assert DescribedPartition(4).as_dict() == {"partition_index": 4, "start_offset": -1, "leader_epoch": 0,
                                               "lag": -1, "error_code": 0, "error_message": None}


def test_share_coordinator_keys_take_kafka_s_base64_topic_ids_and_uuids() -> None:
    topic = uuid.uuid4()
    b64 = base64.urlsafe_b64encode(topic.bytes).decode().rstrip("=")
    assert ShareStateService.parse_key(f"g:{b64}:2") == ("g", str(topic), 2)
    assert ShareStateService.parse_key(f"a:b:{topic}:0") == ("a:b", str(topic), 0)  # the group may hold colons
    for bad in ("", "g", f"g:{topic}", f"g:{topic}:-1", f"g:{topic}:x", "g:not-a-uuid:0", f":{topic}:0"):
        assert ShareStateService.parse_key(bad) is None, bad


def test_a_partition_is_in_use_while_some_session_of_its_group_fetches_it() -> None:
    cache = ShareSessionCache()
    conn = object()
    cache.fetch("g", "m1", 0, conn, add=[("t", 0), ("t", 1)])
    cache.fetch("g", "m2", 0, conn, add=[("t", 1)])
    cache.fetch("h", "m3", 0, conn, add=[("t", 0)])
    assert cache.in_use("g", ("t", 0)) and cache.in_use("g", ("t", 1))
    cache.fetch("g", "m1", -1, conn)  # m1 closes
    assert not cache.in_use("g", ("t", 0)) and cache.in_use("g", ("t", 1))
    assert cache.in_use("h", ("t", 0))  # another group's session is not this group's
    cache.connection_closed(conn)
    assert not cache.in_use("g", ("t", 1)) and not cache.in_use("h", ("t", 0))
