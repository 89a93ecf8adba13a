"""The synchronous facade (for Spark executors and scripts) against a real broker,
cross-checked with confluent-kafka."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import TopicPartition

from cluster.client.config import InvalidConfig
from cluster.client.metadata import ClientCluster
from cluster.client.sync import SyncAdmin, SyncConsumer, SyncProducer
from cluster.protocol.api_keys import ApiKey


def test_sync_produce_consume_admin_roundtrip(broker) -> None:  # type: ignore[no-untyped-def]
    bs = broker.bootstrap
    with SyncAdmin(bs) as admin:
        admin.create_topic("sync", 2, 1)
        assert [t.name for t in admin.metadata(["sync"]).topics] == ["sync"]
    delivered = []
    done = threading.Event()

    def on_delivery(md, err) -> None:  # type: ignore[no-untyped-def]
        delivered.append((md, err))
        if len(delivered) == 50:
            done.set()

    with SyncProducer({"bootstrap.servers": bs, "linger.ms": 1}) as p:
        for i in range(50):
            p.produce("sync", b"v%d" % i, key=b"k%d" % i, partition=i % 2, on_delivery=on_delivery)
        p.produce_many("sync", [(None, b"bulk%d" % i) for i in range(1000)])
        last = p.send_and_wait("sync", b"last", partition=0)
        p.flush()
    assert done.wait(10)
    assert all(err is None for _, err in delivered)
    assert sorted(md.offset for md, _ in delivered if md.partition == 0) == list(range(25))
    with SyncConsumer({"bootstrap.servers": bs, "auto.offset.reset": "earliest"}) as c:
        c.assign([("sync", 0), ("sync", 1)])
        got: dict[tuple[str, int], list] = {}
        while sum(map(len, got.values())) < 1051:
            batch = c.poll(5.0)
            assert batch, "records stopped arriving"
            for tp, recs in batch.items():
                got.setdefault(tp, []).extend(recs)
        assert c.position(("sync", 0)) == last.offset + 1
    assert sum(map(len, got.values())) == 1051
    for recs in got.values():
        assert [r.offset for r in recs] == list(range(len(recs)))
    # librdkafka reads the same partition 0 identically.
    ck = CkConsumer({"bootstrap.servers": bs, "group.id": "ck-sync", "enable.auto.commit": False})
    try:
        ck.assign([TopicPartition("sync", 0, 0)])
        msgs = []
        while len(msgs) < len(got[("sync", 0)]):
            msgs += [m for m in ck.consume(1000, 5.0) if m.error() is None]
        assert [(m.offset(), m.key(), m.value()) for m in msgs] == \
            [(r.offset, r.key, r.value) for r in got[("sync", 0)]]
    finally:
        ck.close()


def test_sync_producer_sends_records_produced_while_its_first_metadata_request_is_out(
        broker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """CI's test_monitoring case: the SyncProducer's thread sends its first Metadata request
    (naming no topic) while the caller's produce() calls (explicit partitions) are held for
    the topic's metadata. Here that answer is held until all 200 are in; flush() must then
    deliver them (it timed out with "0 batches still unacknowledged": nothing asked again)."""
    with SyncAdmin(broker.bootstrap) as admin:
        admin.create_topic("pageviews", 2, 1)
    held, release = threading.Event(), threading.Event()
    asked: list[list[str] | None] = []
    real_any_connection = ClientCluster.any_connection

    class HoldFirstMetadataAnswer:
        def __init__(self, conn: Any) -> None:
            self._conn = conn

        def __getattr__(self, name: str) -> Any:
            return getattr(self._conn, name)

        async def request(self, api_key: int, body: Any, **kwargs: Any) -> Any:
            resp = await self._conn.request(api_key, body, **kwargs)
            if api_key == ApiKey.METADATA:
                asked.append(None if body["topics"] is None else [t["name"] for t in body["topics"]])
                if len(asked) == 1:
                    held.set()
                    await trio.to_thread.run_sync(release.wait, 60)
            return resp

    async def any_connection(self: ClientCluster) -> Any:
        return HoldFirstMetadataAnswer(await real_any_connection(self))

    monkeypatch.setattr(ClientCluster, "any_connection", any_connection)
    with SyncProducer({"bootstrap.servers": broker.bootstrap, "acks": "all"}) as p:
        assert held.wait(30), "the producer sent no Metadata request"
        assert asked == [[]], asked
        for i in range(200):
            p.produce("pageviews", b"v%d" % i, partition=i % 2)
        release.set()
        p.flush(20)
    assert ["pageviews"] in asked, asked
    ck = CkConsumer({"bootstrap.servers": broker.bootstrap, "group.id": "ck-held"})
    try:
        assert [ck.get_watermark_offsets(TopicPartition("pageviews", i), timeout=10) for i in (0, 1)] == \
            [(0, 100), (0, 100)]
    finally:
        ck.close()


def test_sync_facade_reports_bad_config_in_the_callers_thread(broker) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidConfig, match="did you mean 'linger.ms'"):
        SyncProducer({"bootstrap.servers": broker.bootstrap, "linger.msx": 1})
    with pytest.raises(InvalidConfig, match="bootstrap.servers is required"):
        SyncConsumer({})
