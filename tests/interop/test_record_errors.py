"""KIP-467 record errors on Produce: a compacted topic refuses records without a key and a
topic with message.timestamp.before/after.max.ms refuses CreateTime timestamps outside
them, as Kafka's LogValidator does — the whole produce is refused, every bad record named
by its index in its batch, nothing written. librdkafka sees the error codes; a raw Produce
v8 shows the record_errors."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cluster.client.connection import BrokerConnection
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.records import Record, encode_batch
from tests.harness import BrokerProcess
from tests.interop.clients import ck_watermarks

pytestmark = pytest.mark.timeout(120)


def _create(bootstrap: str, name: str, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # referenced until the answer: a collected client cancels it
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(15)


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, int]]) -> list[Any]:
    """One batch (linger), no retries; each record's delivery error (None: written)."""
    errors: list[Any] = [None] * len(records)
    done = [False] * len(records)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 200, "enable.idempotence": False,
                         "retries": 0, "message.timeout.ms": 10000})

    def report(i: int) -> Any:
        def cb(err: Any, msg: Any) -> None:
            errors[i], done[i] = err, True
        return cb

    for i, (key, value, ts) in enumerate(records):
        producer.produce(topic, key=key, value=value, timestamp=ts, on_delivery=report(i))
    assert producer.flush(15) == 0 and all(done)
    return [None if e is None else e.code() for e in errors]


def _raw_produce(bootstrap: str, topic: str, records: list[Record]) -> Any:
    host, port = bootstrap.rsplit(":", 1)

    async def go() -> Any:
        conn = await BrokerConnection(host, int(port), client_id="kip467-test").connect()
        try:
            resp = await conn.request(ApiKey.PRODUCE, {
                "transactional_id": None, "acks": -1, "timeout": 10000,
                "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": encode_batch(records)}]}]},
                version=8)
            return resp.responses[0].partition_responses[0]
        finally:
            await conn.aclose()

    return trio.run(go)


def test_a_compacted_topic_refuses_keyless_records_by_index(broker: BrokerProcess) -> None:
    _create(broker.bootstrap, "compacted", {"cleanup.policy": "compact"})
    now = int(time.time() * 1000)
    got = _produce(broker.bootstrap, "compacted", [(b"k0", b"a", now), (None, b"b", now), (b"k2", b"c", now)])
    assert got == [KafkaError.INVALID_RECORD] * 3, got
    assert ck_watermarks(broker.bootstrap, "compacted", 1) == {0: (0, 0)}  # nothing written
    answer = _raw_produce(broker.bootstrap, "compacted", [
        Record(0, now, b"k", b"v", ()), Record(1, now, None, b"v", ()), Record(2, now, None, b"v", ())])
    assert answer.error_code == KafkaError.INVALID_RECORD
    assert [(e.batch_index, e.batch_index_error_message) for e in answer.record_errors] == [
        (i, "Compacted topic cannot accept message without key in topic partition compacted-0.") for i in (1, 2)]
    assert answer.error_message == ("2 record(s) rejected: Compacted topic cannot accept message without key in "
                                    "topic partition compacted-0.")
    # keyed records still go in
    assert _produce(broker.bootstrap, "compacted", [(b"k0", b"a", now), (b"k1", b"b", now)]) == [None, None]
    assert ck_watermarks(broker.bootstrap, "compacted", 1) == {0: (0, 2)}


def test_timestamps_outside_before_and_after_max_ms_are_refused(broker: BrokerProcess) -> None:
    _create(broker.bootstrap, "bounded", {"message.timestamp.before.max.ms": "3600000",
                                          "message.timestamp.after.max.ms": "60000"})
    now = int(time.time() * 1000)
    assert _produce(broker.bootstrap, "bounded", [(b"k", b"old", now - 7_200_000)]) == [KafkaError.INVALID_TIMESTAMP]
    assert _produce(broker.bootstrap, "bounded", [(b"k", b"future", now + 600_000)]) == [KafkaError.INVALID_TIMESTAMP]
    answer = _raw_produce(broker.bootstrap, "bounded", [Record(0, now, None, b"v", ()),
                                                        Record(1, now - 7_200_000, None, b"v", ())])
    assert answer.error_code == KafkaError.INVALID_TIMESTAMP
    assert [e.batch_index for e in answer.record_errors] == [1]
    assert answer.record_errors[0].batch_index_error_message.startswith(f"Timestamp {now - 7_200_000} of message")
    assert _produce(broker.bootstrap, "bounded", [(b"k", b"fine", now - 1_000_000)]) == [None]
    assert ck_watermarks(broker.bootstrap, "bounded", 1) == {0: (0, 1)}
    # the deprecated message.timestamp.difference.max.ms bounds both sides when they are unset
    _create(broker.bootstrap, "legacy-bound", {"message.timestamp.difference.max.ms": "60000"})
    assert _produce(broker.bootstrap, "legacy-bound", [(b"k", b"old", now - 600_000)]) == [KafkaError.INVALID_TIMESTAMP]
    assert _produce(broker.bootstrap, "legacy-bound", [(b"k", b"new", int(time.time() * 1000))]) == [None]
