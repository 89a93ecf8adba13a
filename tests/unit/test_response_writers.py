"""The broker's fast answer writers against kio's generic encoder, on drawn answers
(derandomized in make test by the Hypothesis profile in tests/conftest.py; make soak draws new
ones): Fetch (cluster/protocol/answer_writers.py), every version from 4 on, and Metadata with
its topics encoded apart (messages.encode_metadata_body), every version; DescribeTopicPartitions
v0 (its topics and the answer around them)."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.protocol.answer_writers import (
    describe_partitions_body,
    describe_partitions_topic_entry,
    fetch_body_parts,
    metadata_topic_entry,
)
from cluster.protocol.messages import (
    decode_response,
    encode_body,
    encode_item,
    encode_metadata_body,
    encode_response,
    response_schema,
)

VERSIONS = range(4, 18)
I32 = st.integers(-2**31, 2**31 - 1)
I64 = st.integers(-2**63, 2**63 - 1)

aborted = st.fixed_dictionaries({"producer_id": I64, "first_offset": I64})
partition = st.fixed_dictionaries(
    {"partition_index": I32, "error_code": st.sampled_from([0, 1, 3, 6, 29, 74, 100])},
    optional={"high_watermark": I64, "last_stable_offset": I64, "log_start_offset": I64,
              "preferred_read_replica": I32, "records": st.none() | st.binary(max_size=300),
              "aborted_transactions": st.none() | st.lists(aborted, max_size=3)})
topic = st.fixed_dictionaries({"topic": st.text(max_size=20), "topic_id": st.none() | st.uuids(),
                               "partitions": st.lists(partition, max_size=4)})
answer = st.fixed_dictionaries({"responses": st.lists(topic, max_size=4)},
                               optional={"throttle_time": st.integers(0, 2**31 - 1), "error_code": st.just(0),
                                         "session_id": I32})


def generic(version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
    cls = response_schema(1, version)
    encoded = struct.pack(">i", correlation_id) + (b"\x00" if cls.__flexible__ else b"") + encode_body(1, version, body)
    return struct.pack(">i", len(encoded)) + encoded


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(VERSIONS), body=answer, correlation_id=I32)
def test_the_fetch_writer_gives_the_generic_encoders_bytes(version: int, body: dict[str, Any],
                                                           correlation_id: int) -> None:
    assert encode_response(1, version, correlation_id, body) == generic(version, correlation_id, body)


@pytest.mark.parametrize("version", VERSIONS)
def test_an_answer_as_the_broker_gives_it_reads_back(version: int) -> None:
    records = bytes(range(256)) * 3
    body = {"throttle_time": 0, "error_code": 0, "session_id": 7, "responses": [
        {"topic": "orders", "topic_id": uuid.UUID(int=5), "partitions": [
            {"partition_index": 0, "error_code": 0, "high_watermark": 10, "last_stable_offset": 10,
             "log_start_offset": 0, "preferred_read_replica": -1, "records": records, "aborted_transactions": None},
            {"partition_index": 1, "error_code": 0, "high_watermark": 3, "last_stable_offset": 2,
             "log_start_offset": 1, "preferred_read_replica": -1, "records": b"",
             "aborted_transactions": [{"producer_id": 9, "first_offset": 2}]}]}]}
    frame = encode_response(1, version, 42, body)
    assert frame == generic(version, 42, body)
    (size,) = struct.unpack(">i", frame[:4])
    assert size == len(frame) - 4
    back = decode_response(1, version, frame[4:])
    parts = back.responses[0].partitions
    assert [p.partition_index for p in parts] == [0, 1]
    assert parts[0].records == records and parts[0].high_watermark == 10
    assert parts[1].aborted_transactions[0].producer_id == 9 and getattr(parts[1], "log_start_offset", -1) == (1 if version >= 5 else -1)


def test_what_only_the_generic_encoder_writes_goes_its_way() -> None:
    tagged = {"responses": [{"topic": "t", "partitions": [{"partition_index": 0, "error_code": 0,
                                                           "diverging_epoch": {"epoch": 3, "end_offset": 7}}]}]}
    assert fetch_body_parts(13, tagged) is None
    assert encode_response(1, 13, 1, tagged) == generic(13, 1, tagged)
    assert fetch_body_parts(16, {"responses": [], "node_endpoints": []}) is None
    assert fetch_body_parts(3, {"responses": []}) is None


metadata_partition = st.fixed_dictionaries({
    "error_code": st.sampled_from([0, 5, 9]), "partition_index": I32, "leader_id": I32, "leader_epoch": I32,
    "replica_nodes": st.lists(I32, max_size=3), "isr_nodes": st.lists(I32, max_size=3),
    "offline_replicas": st.lists(I32, max_size=2)},
    optional={"eligible_leader_replicas": st.lists(I32, max_size=2),
              "last_known_elr": st.lists(I32, max_size=2)})
metadata_topic = st.fixed_dictionaries({
    "error_code": st.sampled_from([0, 3, 29]), "name": st.text(max_size=12) | st.none(), "is_internal": st.booleans(),
    "topic_id": st.uuids(), "topic_authorized_operations": I32,
    "partitions": st.lists(metadata_partition, max_size=3)})
metadata_answer = st.fixed_dictionaries({
    "throttle_time": st.integers(0, 2**31 - 1), "cluster_id": st.text(max_size=10), "controller_id": I32,
    "cluster_authorized_operations": I32,
    "brokers": st.lists(st.fixed_dictionaries({"node_id": I32, "host": st.text(max_size=9),
                                               "port": st.integers(0, 65535), "rack": st.none() | st.text(max_size=4)}),
                        max_size=3),
    "topics": st.lists(metadata_topic, max_size=4)})


@settings(max_examples=200, deadline=None)
@given(version=st.integers(0, 12), body=metadata_answer)
def test_a_metadata_answer_with_its_topics_encoded_apart_is_the_generic_one(version: int,
                                                                             body: dict[str, Any]) -> None:
    topics = [encode_item(3, version, "topics", t) for t in body["topics"]]
    rest = {k: v for k, v in body.items() if k != "topics"}
    assert encode_metadata_body(version, rest, topics) == encode_body(3, version, body)


def test_a_metadata_topic_the_fast_writer_leaves_to_the_generic_one() -> None:
    assert metadata_topic_entry(12, {"error_code": 100, "name": None, "topic_id": None, "partitions": []}) is None
    assert metadata_topic_entry(12, {"name": "t", "unknown_field": 1}) is None


dtp_partition = st.fixed_dictionaries({
    "error_code": st.sampled_from([0, 5]), "partition_index": I32, "leader_id": I32, "leader_epoch": I32,
    "replica_nodes": st.lists(I32, max_size=3), "isr_nodes": st.lists(I32, max_size=3),
    "eligible_leader_replicas": st.none() | st.lists(I32, max_size=2),
    "last_known_elr": st.none() | st.lists(I32, max_size=2), "offline_replicas": st.lists(I32, max_size=2)})
dtp_topic = st.fixed_dictionaries({
    "error_code": st.sampled_from([0, 3, 29]), "name": st.text(max_size=12) | st.none(), "is_internal": st.booleans(),
    "topic_id": st.uuids(), "topic_authorized_operations": I32, "partitions": st.lists(dtp_partition, max_size=3)})
dtp_answer = st.fixed_dictionaries({
    "throttle_time": st.integers(0, 2**31 - 1), "topics": st.lists(dtp_topic, max_size=4),
    "next_cursor": st.none() | st.fixed_dictionaries({"topic_name": st.text(max_size=12),
                                                      "partition_index": st.integers(0, 2**31 - 1)})})


@settings(max_examples=200, deadline=None)
@given(body=dtp_answer)
def test_a_describe_topic_partitions_answer_written_straight_is_the_generic_one(body: dict[str, Any]) -> None:
    topics = [describe_partitions_topic_entry(t) for t in body["topics"]]
    assert all(t is not None for t in topics)
    written = describe_partitions_body(body["throttle_time"], topics, body["next_cursor"])  # type: ignore[arg-type]
    assert written == encode_body(75, 0, body)


def test_a_describe_topic_partitions_topic_the_fast_writer_leaves_to_the_generic_one() -> None:
    assert describe_partitions_topic_entry({"name": "t", "unknown_field": 1}) is None
