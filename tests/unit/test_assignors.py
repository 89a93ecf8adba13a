"""Consumer-group assignors and the "consumer" embedded protocol (cluster/client/assignors.py)."""

from __future__ import annotations

import io
import random
import struct
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.consumer_protocol_assignment.v0 import data as assignment_v0
from kio.schema.consumer_protocol_assignment.v1 import data as assignment_v1
from kio.schema.consumer_protocol_assignment.v2 import data as assignment_v2
from kio.schema.consumer_protocol_assignment.v3 import data as assignment_v3
from kio.schema.consumer_protocol_subscription.v0 import data as subscription_v0
from kio.schema.consumer_protocol_subscription.v1 import data as subscription_v1
from kio.schema.consumer_protocol_subscription.v2 import data as subscription_v2
from kio.schema.consumer_protocol_subscription.v3 import data as subscription_v3
from kio.schema.types import TopicName
from kio.serial import entity_writer
from kio.static.primitive import i32

from cluster.client.assignors import ASSIGNORS, RangeAssignor, RoundRobinAssignor, assignor_for
from cluster.protocol.consumer_protocol import (
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)

RANGE = RangeAssignor()
ROUNDROBIN = RoundRobinAssignor()


def kio_bytes(version: int, entity: Any) -> bytes:
    buffer = io.BytesIO(struct.pack(">h", version))
    buffer.seek(2)
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def kafka_string(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def subs(**topics_by_member: list[str]) -> dict[str, Subscription]:
    return {member: Subscription(topics=topics) for member, topics in topics_by_member.items()}


# --- subscription encoding -------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscription_round_trip_keeps_the_fields_of_its_version(version: int) -> None:
    data = encode_subscription(
        ["orders", "payments"], b"\x01\x02", [("orders", 0), ("payments", 3), ("orders", 2)],
        version, generation_id=7, rack_id="rack-a",
    )
    assert data[:2] == struct.pack(">h", version)
    assert decode_subscription(data) == Subscription(
        topics=["orders", "payments"],
        user_data=b"\x01\x02",
        owned_partitions=[("orders", 0), ("orders", 2), ("payments", 3)] if version >= 1 else [],
        generation_id=7 if version >= 2 else -1,
        rack_id="rack-a" if version >= 3 else None,
    )


def test_subscription_defaults_round_trip() -> None:
    assert decode_subscription(encode_subscription([])) == Subscription(topics=[])
    assert decode_subscription(encode_subscription(["t"])) == Subscription(topics=["t"])


def test_subscription_v0_matches_the_wire_format() -> None:
    expected = struct.pack(">hi", 0, 1) + kafka_string("t") + struct.pack(">i", -1)
    assert encode_subscription(["t"], version=0) == expected
    assert decode_subscription(expected) == Subscription(topics=["t"])


def test_subscription_as_librdkafka_writes_it() -> None:
    # librdkafka: v3, empty (not null) user data, no owned partitions, generation -1, null rack.
    data = (
        struct.pack(">hi", 3, 2) + kafka_string("a") + kafka_string("b")
        + struct.pack(">i", 0) + struct.pack(">i", 0) + struct.pack(">i", -1) + struct.pack(">h", -1)
    )
    assert decode_subscription(data) == Subscription(topics=["a", "b"], user_data=b"")


def test_subscription_decodes_what_kio_writes_for_each_version() -> None:
    v0 = subscription_v0.ConsumerProtocolSubscription(topics=("t",), user_data=b"u")
    assert decode_subscription(kio_bytes(0, v0)) == Subscription(topics=["t"], user_data=b"u")

    v1 = subscription_v1.ConsumerProtocolSubscription(
        topics=("t",), user_data=None,
        owned_partitions=(
            subscription_v1.TopicPartition(topic=TopicName("t"), partitions=(i32(1), i32(4))),
        ),
    )
    assert decode_subscription(kio_bytes(1, v1)) == Subscription(
        topics=["t"], owned_partitions=[("t", 1), ("t", 4)]
    )

    v2 = subscription_v2.ConsumerProtocolSubscription(
        topics=("t", "u"), user_data=b"",
        owned_partitions=(subscription_v2.TopicPartition(topic=TopicName("u"), partitions=(i32(0),)),),
        generation_id=i32(12),
    )
    assert decode_subscription(kio_bytes(2, v2)) == Subscription(
        topics=["t", "u"], user_data=b"", owned_partitions=[("u", 0)], generation_id=12
    )

    v3 = subscription_v3.ConsumerProtocolSubscription(
        topics=("t",), user_data=None, owned_partitions=(), generation_id=i32(3), rack_id="r1",
    )
    assert decode_subscription(kio_bytes(3, v3)) == Subscription(
        topics=["t"], generation_id=3, rack_id="r1"
    )


def test_subscription_newer_version_is_read_with_the_newest_schema() -> None:
    body = encode_subscription(["t"], b"x", [("t", 2)], 3, generation_id=5, rack_id="r")[2:]
    future = struct.pack(">h", 9) + body + b"fields a future version appended"
    assert decode_subscription(future) == Subscription(
        topics=["t"], user_data=b"x", owned_partitions=[("t", 2)], generation_id=5, rack_id="r"
    )


def test_subscription_trailing_bytes_are_ignored() -> None:
    data = encode_subscription(["t"], version=1) + b"\x00\x00\x00\x07"
    assert decode_subscription(data) == Subscription(topics=["t"])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "0 bytes, need a 2-byte version"),
        (b"\x00", "1 bytes, need a 2-byte version"),
        (b"\xff\xff", "negative version -1"),
        (b"\x00\x00", "subscription v0"),
        (struct.pack(">hi", 1, 1), "subscription v1"),
        (struct.pack(">hi", 0, 2**31 - 1), "subscription v0"),
        (struct.pack(">hih", 0, 1, 2) + b"\xff\xfe" + struct.pack(">i", -1), "subscription v0"),
        (struct.pack(">hi", 0, 0) + struct.pack(">i", -5), "subscription v0"),
        (struct.pack(">hi", 0, -2), "subscription v0"),
        # A v3 header on a v1 body: the v3 fields are missing.
        (struct.pack(">h", 3) + encode_subscription(["t"], version=1)[2:], "subscription v3"),
        # Null arrays, which kio reads as None but Kafka's schema forbids.
        (struct.pack(">hii", 0, -1, -1), "topics is null"),
        (struct.pack(">hiii", 1, 0, -1, -1), "owned partitions is null"),
        (struct.pack(">hiii", 1, 0, -1, 1) + kafka_string("t") + struct.pack(">i", -1),
         "partitions of topic 't' is null"),
    ],
)
def test_malformed_subscription_raises_value_error(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match="cannot decode consumer protocol subscription") as info:
        decode_subscription(data)
    assert message in str(info.value)


def test_encode_subscription_rejects_unknown_version_and_bad_fields() -> None:
    with pytest.raises(ValueError, match="subscription version 4 is not supported"):
        encode_subscription(["t"], version=4)
    with pytest.raises(ValueError, match="subscription version -1 is not supported"):
        encode_subscription(["t"], version=-1)
    with pytest.raises(ValueError, match="cannot encode consumer protocol subscription v1"):
        encode_subscription(["x" * 40_000])


# --- assignment encoding ---------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_assignment_round_trip(version: int) -> None:
    partitions = {"orders": [0, 2], "payments": [1]}
    data = encode_assignment(partitions, b"ud", version)
    assert data[:2] == struct.pack(">h", version)
    assert decode_assignment(data) == [("orders", 0), ("orders", 2), ("payments", 1)]
    pairs = [("orders", 0), ("payments", 1), ("orders", 2)]
    assert encode_assignment(pairs, b"ud", version) == data


def test_assignment_v0_matches_the_wire_format_librdkafka_writes() -> None:
    data = (
        struct.pack(">hi", 0, 1) + kafka_string("t") + struct.pack(">iii", 2, 0, 1)
        + struct.pack(">i", -1)
    )
    assert encode_assignment({"t": [0, 1]}, version=0) == data
    assert decode_assignment(data) == [("t", 0), ("t", 1)]


def test_assignment_decodes_what_kio_writes_for_each_version() -> None:
    for version, module in enumerate([assignment_v0, assignment_v1, assignment_v2, assignment_v3]):
        entity = module.ConsumerProtocolAssignment(
            assigned_partitions=(
                module.TopicPartition(topic="b", partitions=(3,)),
                module.TopicPartition(topic="a", partitions=(0, 1)),
            ),
            user_data=b"u",
        )
        assert decode_assignment(kio_bytes(version, entity)) == [("b", 3), ("a", 0), ("a", 1)]


def test_empty_assignments() -> None:
    assert decode_assignment(b"") == []
    assert decode_assignment(encode_assignment({})) == []
    assert decode_assignment(encode_assignment([], version=0)) == []


def test_assignment_newer_version_and_trailing_bytes() -> None:
    body = encode_assignment({"t": [5]}, version=3)[2:]
    assert decode_assignment(struct.pack(">h", 7) + body + b"more") == [("t", 5)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00", "1 bytes, need a 2-byte version"),
        (b"\x80\x00", "negative version -32768"),
        (b"\x00\x01", "assignment v1"),
        (struct.pack(">hi", 0, 1) + kafka_string("t") + struct.pack(">ii", 3, 0), "assignment v0"),
        (struct.pack(">hii", 0, -1, -1), "partitions is null"),
        (struct.pack(">hi", 0, 1) + kafka_string("t") + struct.pack(">ii", -1, -1),
         "partitions of topic 't' is null"),
    ],
)
def test_malformed_assignment_raises_value_error(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match="cannot decode consumer protocol assignment") as info:
        decode_assignment(data)
    assert message in str(info.value)


def test_encode_assignment_rejects_unknown_version() -> None:
    with pytest.raises(ValueError, match="assignment version 4 is not supported"):
        encode_assignment({"t": [0]}, version=4)


# --- range -----------------------------------------------------------------------------------


def test_range_two_consumers_five_partitions() -> None:
    assert RANGE.assign({"t": 5}, subs(c1=["t"], c2=["t"])) == {
        "c1": [("t", 0), ("t", 1), ("t", 2)],
        "c2": [("t", 3), ("t", 4)],
    }


def test_range_each_topic_starts_again_from_the_first_consumer() -> None:
    # The example in Kafka's RangeAssignor javadoc.
    assert RANGE.assign({"t0": 3, "t1": 3}, subs(C0=["t0", "t1"], C1=["t0", "t1"])) == {
        "C0": [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)],
        "C1": [("t0", 2), ("t1", 2)],
    }


def test_range_uneven_subscriptions() -> None:
    assignment = RANGE.assign({"a": 3, "b": 4}, subs(c1=["a", "b"], c2=["a"], c3=["b"]))
    assert assignment == {
        "c1": [("a", 0), ("a", 1), ("b", 0), ("b", 1)],
        "c2": [("a", 2)],
        "c3": [("b", 2), ("b", 3)],
    }


def test_range_orders_consumers_by_member_id_not_by_arrival() -> None:
    subscriptions = {m: Subscription(topics=["t"]) for m in ["m-3", "m-1", "m-2"]}
    assert RANGE.assign({"t": 4}, subscriptions) == {
        "m-3": [("t", 3)],
        "m-1": [("t", 0), ("t", 1)],
        "m-2": [("t", 2)],
    }


def test_range_more_members_than_partitions_leaves_some_empty() -> None:
    assert RANGE.assign({"t": 2}, subs(c1=["t"], c2=["t"], c3=["t"], idle=[])) == {
        "c1": [("t", 0)],
        "c2": [("t", 1)],
        "c3": [],
        "idle": [],
    }


def test_nonexistent_topics_are_skipped() -> None:
    subscriptions = subs(c1=["ghost", "t"], c2=["ghost"])
    expected = {"c1": [("t", 0), ("t", 1)], "c2": []}
    assert RANGE.assign({"t": 2}, subscriptions) == expected
    assert ROUNDROBIN.assign({"t": 2}, subscriptions) == expected
    assert RANGE.assign({}, subscriptions) == {"c1": [], "c2": []}
    assert ROUNDROBIN.assign({"t": 2, "unsubscribed": 3}, subscriptions) == expected


def test_no_members() -> None:
    assert RANGE.assign({"t": 3}, {}) == {}
    assert ROUNDROBIN.assign({"t": 3}, {}) == {}


def test_static_members_sort_first_by_group_instance_id() -> None:
    # Kafka's MemberInfo order: group.instance.id when present (and such members first).
    subscriptions = subs(**{"a-dynamic": ["t"], "z-static": ["t"], "m-static": ["t"]})
    subscriptions["z-static"] = replace(subscriptions["z-static"], group_instance_id="instance-1")
    subscriptions["m-static"] = replace(subscriptions["m-static"], group_instance_id="instance-2")
    assert RANGE.assign({"t": 3}, subscriptions) == {
        "a-dynamic": [("t", 2)],
        "z-static": [("t", 0)],
        "m-static": [("t", 1)],
    }
    assert ROUNDROBIN.assign({"t": 4}, subscriptions) == {
        "a-dynamic": [("t", 2)],
        "z-static": [("t", 0), ("t", 3)],
        "m-static": [("t", 1)],
    }


# --- roundrobin ------------------------------------------------------------------------------


def test_roundrobin_identical_subscriptions() -> None:
    # The first example in Kafka's RoundRobinAssignor javadoc.
    assert ROUNDROBIN.assign({"t0": 3, "t1": 3}, subs(C0=["t0", "t1"], C1=["t0", "t1"])) == {
        "C0": [("t0", 0), ("t0", 2), ("t1", 1)],
        "C1": [("t0", 1), ("t1", 0), ("t1", 2)],
    }


def test_roundrobin_two_topics_three_members() -> None:
    subscriptions = {m: Subscription(topics=["b", "a"]) for m in ["m3", "m1", "m2"]}
    assert ROUNDROBIN.assign({"a": 4, "b": 3}, subscriptions) == {
        "m1": [("a", 0), ("a", 3), ("b", 2)],
        "m2": [("a", 1), ("b", 0)],
        "m3": [("a", 2), ("b", 1)],
    }


def test_roundrobin_skips_members_not_subscribed() -> None:
    # The second example in Kafka's RoundRobinAssignor javadoc.
    subscriptions = subs(C0=["t0"], C1=["t0", "t1"], C2=["t0", "t1", "t2"])
    assert ROUNDROBIN.assign({"t0": 1, "t1": 2, "t2": 3}, subscriptions) == {
        "C0": [("t0", 0)],
        "C1": [("t1", 0)],
        "C2": [("t1", 1), ("t2", 0), ("t2", 1), ("t2", 2)],
    }


def test_roundrobin_cycle_continues_across_topics() -> None:
    subscriptions = subs(m1=["b"], m2=["a", "b"], m3=["a", "b"])
    assert ROUNDROBIN.assign({"a": 2, "b": 2}, subscriptions) == {
        "m1": [("b", 0)],
        "m2": [("a", 0), ("b", 1)],
        "m3": [("a", 1)],
    }


# --- registry --------------------------------------------------------------------------------


def test_assignor_names() -> None:
    assert RANGE.name == "range"
    assert ROUNDROBIN.name == "roundrobin"
    assert set(ASSIGNORS) == {"range", "roundrobin"}
    assert all(name == assignor.name for name, assignor in ASSIGNORS.items())


def test_assignor_for_parses_a_strategy_list_in_preference_order() -> None:
    assert [a.name for a in assignor_for("range")] == ["range"]
    assert [a.name for a in assignor_for("roundrobin, range")] == ["roundrobin", "range"]
    assert [a.name for a in assignor_for("range,roundrobin,range")] == ["range", "roundrobin"]
    java = "org.apache.kafka.clients.consumer.RoundRobinAssignor"
    assert [a.name for a in assignor_for(java)] == ["roundrobin"]


def test_assignor_for_names_the_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="unknown partition.assignment.strategy 'cooperative-sticky'"):
        assignor_for("range,cooperative-sticky")
    with pytest.raises(ValueError, match="partition.assignment.strategy is empty"):
        assignor_for(" ")
    with pytest.raises(ValueError, match="unknown partition.assignment.strategy ''"):
        assignor_for("range,")


# --- properties ------------------------------------------------------------------------------

TOPICS = ["a", "b", "c", "d"]

groups = st.tuples(
    st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 12), max_size=len(TOPICS)),
    st.dictionaries(
        st.text("xyz-0123", min_size=1, max_size=6),
        st.lists(st.sampled_from([*TOPICS, "ghost"]), max_size=5),
        max_size=7,
    ),
    st.randoms(use_true_random=False),
)


def expected_range(count: int, members: list[str]) -> dict[str, list[int]]:
    # The formula of Kafka's RangeAssignor: start = n*i + min(i, extra).
    per_member, extra = divmod(count, len(members))
    return {
        m: list(range(per_member * i + min(i, extra), per_member * (i + 1) + min(i + 1, extra)))
        for i, m in enumerate(members)
    }


@settings(max_examples=300, deadline=None)
@given(groups)
def test_every_partition_is_assigned_once_to_a_subscriber(
    group: tuple[dict[str, int], dict[str, list[str]], random.Random],
) -> None:
    partitions_per_topic, topics_by_member, rnd = group
    subscriptions = {m: Subscription(topics=ts) for m, ts in topics_by_member.items()}
    shuffled_members = list(subscriptions)
    rnd.shuffle(shuffled_members)
    shuffled = {m: subscriptions[m] for m in shuffled_members}

    for assignor in ASSIGNORS.values():
        assignment = assignor.assign(partitions_per_topic, subscriptions)
        assert set(assignment) == set(subscriptions)
        assert assignor.assign(partitions_per_topic, shuffled) == assignment

        owners: dict[tuple[str, int], list[str]] = {}
        for member, partitions in assignment.items():
            assert partitions == sorted(partitions)
            for tp in partitions:
                owners.setdefault(tp, []).append(member)
                assert tp[0] in subscriptions[member].topics
        subscribed = {t for s in subscriptions.values() for t in s.topics}
        assert set(owners) == {
            (t, p) for t, n in partitions_per_topic.items() if t in subscribed for p in range(n)
        }
        assert all(len(ms) == 1 for ms in owners.values())

    range_assignment = RANGE.assign(partitions_per_topic, subscriptions)
    for topic, count in partitions_per_topic.items():
        members = sorted(m for m, s in subscriptions.items() if topic in s.topics)
        if not members:
            continue
        got = {m: [p for t, p in range_assignment[m] if t == topic] for m in members}
        assert max(map(len, got.values())) - min(map(len, got.values())) <= 1
        assert got == expected_range(count, members)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 12), max_size=len(TOPICS)),
    st.lists(st.sampled_from(TOPICS), max_size=4),
    st.integers(1, 6),
)
def test_roundrobin_is_balanced_when_subscriptions_are_identical(
    partitions_per_topic: dict[str, int], topics: list[str], member_count: int
) -> None:
    subscriptions = {f"member-{i}": Subscription(topics=topics) for i in range(member_count)}
    sizes = [len(ps) for ps in ROUNDROBIN.assign(partitions_per_topic, subscriptions).values()]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == sum(n for t, n in partitions_per_topic.items() if t in topics)
