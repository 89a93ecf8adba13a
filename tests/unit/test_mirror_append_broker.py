"""MirrorAppend through a whole broker in one process (the request router, the handler, the
replica manager, the log), under trio's MockClock: a mirror topic takes batches at their
offsets and refuses producers; an ordinary topic and another topic id refuse MirrorAppend;
deleting `mirror.source` promotes the topic, whose producers may have ids the source's had."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import orjson

from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.internal import MIRROR_APPEND_API_KEY, internal_frame, mirror_append_payload
from cluster.protocol.messages import decode_response, encode_request
from cluster.protocol.record_batch import TRANSACTIONAL_MASK
from tests.batches import values_batch
from tests.unit.test_protocol_fuzz import open_broker, run_dispatch

MIRROR, ORDINARY = "m", "o"


def call(srv: Any, api: int, version: int, body: dict[str, Any]) -> Any:
    resp = run_dispatch(srv, encode_request(api, version, 1, b"test", body)[4:])
    assert resp is not None
    return decode_response(api, version, resp[4:])


def mirror_append(srv: Any, topic: str, topic_id: str, data: bytes, log_start: int = -1) -> dict[str, Any]:
    frame = internal_frame(MIRROR_APPEND_API_KEY, 7, mirror_append_payload(topic, topic_id, 5000,
                                                                           [(0, data, log_start)]))
    resp = run_dispatch(srv, frame[4:])
    assert resp is not None and int.from_bytes(resp[4:8], "big") == 7
    answer: dict[str, Any] = orjson.loads(resp[8:])
    return answer


def produce(srv: Any, topic: str, data: bytes) -> Any:
    got = call(srv, ApiKey.PRODUCE, 8, {"acks": -1, "timeout": 5000, "transactional_id": None, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": data}]}]})
    return got.responses[0].partition_responses[0]


def test_a_mirror_topic_through_the_broker(tmp_path: Path) -> None:
    srv = open_broker(tmp_path)
    try:
        created = call(srv, ApiKey.CREATE_TOPICS, 5, {"timeout": 10000, "validate_only": False, "topics": [
            {"name": MIRROR, "num_partitions": 1, "replication_factor": 1, "assignments": [],
             "configs": [{"name": "mirror.source", "value": "east:m"}]},
            {"name": ORDINARY, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}]})
        assert [t.error_code for t in created.topics] == [0, 0]
        image = srv.broker.metadata.image
        mirror_id, ordinary_id = (image.topics_by_name[t].topic_id for t in (MIRROR, ORDINARY))

        # Batches at their source offsets, a gap between them, the source's log start inside.
        # The first from an idempotent producer of the source, id 0; the last a transaction
        # of the source's producer 1, open.
        data = (values_batch([b"a", b"b", b"c"], base_offset=5, producer_id=0, producer_epoch=0, base_sequence=0)
                + values_batch([b"d"], base_offset=10)
                + values_batch([b"open"], base_offset=11, producer_id=1, producer_epoch=0, base_sequence=0,
                               attributes=TRANSACTIONAL_MASK))
        answer = mirror_append(srv, MIRROR, mirror_id, data, log_start=6)
        assert answer["error_code"] == 0
        assert answer["partitions"] == [{"partition": 0, "error_code": 0, "error_message": None,
                                         "log_end_offset": 12, "high_watermark": 12, "log_start_offset": 6}]
        # The same again: skipped, answered alike.
        assert mirror_append(srv, MIRROR, mirror_id, data)["partitions"][0]["log_end_offset"] == 12

        refused = produce(srv, MIRROR, values_batch([b"client"]))
        assert refused.error_code == ErrorCode.invalid_topic_exception
        assert "read-only mirror of east:m" in refused.error_message
        deleted = call(srv, ApiKey.DELETE_RECORDS, 2, {"timeout": 5000, "topics": [
            {"name": MIRROR, "partitions": [{"partition_index": 0, "offset": 8}]}]})
        assert deleted.topics[0].partitions[0].error_code == ErrorCode.invalid_topic_exception
        # A transaction cannot take it in either (its produce would be refused).
        added = call(srv, ApiKey.ADD_PARTITIONS_TO_TXN, 3, {
            "v3_and_below_transactional_id": "tx", "v3_and_below_producer_id": 5, "v3_and_below_producer_epoch": 0,
            "v3_and_below_topics": [{"name": MIRROR, "partitions": [0]}]})
        assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == \
            ErrorCode.invalid_topic_exception

        ordinary = mirror_append(srv, ORDINARY, ordinary_id, data)["partitions"][0]
        assert ordinary["error_code"] == ErrorCode.invalid_request and "not a mirror topic" in ordinary["error_message"]
        other_id = mirror_append(srv, MIRROR, str(uuid.uuid4()), data)
        assert other_id["error_code"] == other_id["partitions"][0]["error_code"] == ErrorCode.unknown_topic_id
        straddling = values_batch([b"x", b"y"], base_offset=11)
        diverged = mirror_append(srv, MIRROR, mirror_id, straddling)["partitions"][0]
        assert diverged["error_code"] == ErrorCode.offset_out_of_range and "diverged" in diverged["error_message"]

        # Described only when set, as the topic's own config.
        described = call(srv, ApiKey.DESCRIBE_CONFIGS, 4, {"include_synonyms": False, "include_documentation": False,
                                                           "resources": [
            {"resource_type": 2, "resource_name": t, "configuration_keys": None} for t in (MIRROR, ORDINARY)]})
        names = [{c.name: c for c in r.configs} for r in described.results]
        assert names[0]["mirror.source"].value == "east:m" and names[0]["mirror.source"].config_source == 1
        assert "mirror.source" not in names[1]

        # Promotion: producers append after the mirrored offsets; MirrorAppend is refused.
        altered = call(srv, ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, {"validate_only": False, "resources": [
            {"resource_type": 2, "resource_name": MIRROR, "configs": [
                {"name": "mirror.source", "config_operation": 1, "value": None}]}]})
        assert altered.responses[0].error_code == 0
        # The leader ended the source's open transaction with an ABORT marker (offset 12)
        # before taking any produce: nothing open, nobody of the source's left.
        part = srv.broker.replicas.partitions[(MIRROR, 0)]
        assert part.log.log_end_offset == 13 and part.log.last_stable_offset(13) == 13
        assert part.log.collect_aborted(11, 13)[0].producer_id == 1
        assert not part.log.producer_state.producers and not part.log.producer_state.carried
        # Producers of this cluster with the same ids and sequences as the source's: neither
        # refused nor answered as a duplicate of a mirrored batch (never written) — the
        # source's aborted one (id 1) among them (issue 40).
        promoted = produce(srv, MIRROR, values_batch([b"x", b"y", b"z"], producer_id=0, producer_epoch=0,
                                                     base_sequence=0))
        assert (promoted.error_code, promoted.base_offset) == (0, 13)
        again = produce(srv, MIRROR, values_batch([b"open"], producer_id=1, producer_epoch=0, base_sequence=0))
        assert (again.error_code, again.base_offset) == (0, 16)
        after = mirror_append(srv, MIRROR, mirror_id, values_batch([b"late"], base_offset=17))["partitions"][0]
        assert after["error_code"] == ErrorCode.invalid_request
    finally:
        srv.broker.close()


def test_a_transaction_open_when_its_topic_became_a_copy_still_ends_with_its_marker(tmp_path: Path) -> None:
    """A promotion or a failback makes the old primary's topic read-only under transactions
    of its own producers: their coordinator's markers are written (or a commit would be
    answered and never read committed); any other marker into a mirror topic is answered
    without being written (it would take an offset the source's next batch holds)."""
    from cluster.client.admin import write_txn_markers_body

    srv = open_broker(tmp_path)
    try:
        created = call(srv, ApiKey.CREATE_TOPICS, 5, {"timeout": 10000, "validate_only": False, "topics": [
            {"name": ORDINARY, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}]})
        assert created.topics[0].error_code == 0
        opened = produce(srv, ORDINARY, values_batch([b"t1", b"t2"], producer_id=5, producer_epoch=0, base_sequence=0,
                                                     attributes=TRANSACTIONAL_MASK))
        assert (opened.error_code, opened.base_offset) == (0, 0)
        altered = call(srv, ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, {"validate_only": False, "resources": [
            {"resource_type": 2, "resource_name": ORDINARY, "configs": [
                {"name": "mirror.source", "config_operation": 0, "value": "dr:o"}]}]})
        assert altered.responses[0].error_code == 0
        part = srv.broker.replicas.partitions[(ORDINARY, 0)]
        assert part.log.last_stable_offset(2) == 0  # the transaction holds it

        def marker(producer_id: int) -> Any:
            got = call(srv, ApiKey.WRITE_TXN_MARKERS, 1, write_txn_markers_body(producer_id, 0, True, 0,
                                                                                [(ORDINARY, 0)]))
            return got.markers[0].topics[0].partitions[0].error_code

        assert marker(6) == 0 and part.log.log_end_offset == 2  # nobody's transaction: not written
        assert marker(5) == 0 and part.log.log_end_offset == 3  # its own: written, committed
        assert part.log.last_stable_offset(3) == 3 and part.log.collect_aborted(0, 3) == []
        refused = produce(srv, ORDINARY, values_batch([b"late"], producer_id=5, producer_epoch=0, base_sequence=2,
                                                      attributes=TRANSACTIONAL_MASK))
        assert refused.error_code == ErrorCode.invalid_topic_exception  # and no new one begins
    finally:
        srv.broker.close()
