"""The synchronous facade (for Spark executors and scripts) against a real broker,
cross-checked with confluent-kafka."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import TopicPartition

from cluster.client.config import InvalidConfig
from cluster.client.sync import SyncAdmin, SyncConsumer, SyncProducer


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


def test_sync_facade_reports_bad_config_in_the_callers_thread(broker) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidConfig, match="did you mean 'linger.ms'"):
        SyncProducer({"bootstrap.servers": broker.bootstrap, "linger.msx": 1})
    with pytest.raises(InvalidConfig, match="bootstrap.servers is required"):
        SyncConsumer({})
