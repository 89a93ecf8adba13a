"""Provenance headers and the decisions made from them (sans-IO)."""

from __future__ import annotations

import uuid

from cluster.protocol.records import Record
from mirror import history
from mirror import provenance as pv
from mirror.checkpoints import Checkpoint
from mirror.history import MirroredPosition
from mirror.worker import WorkerConfig
from topology.model import MirrorSpec


def test_first_hop_adds_provenance_after_the_records_own_headers() -> None:
    headers = pv.mirrored_headers((("app", b"x"), ("app", None)), "east", 3, 42)
    assert headers == (("app", b"x"), ("app", None), (pv.SOURCE_CLUSTER, b"east"), (pv.SOURCE_PARTITION, b"3"),
                       (pv.SOURCE_OFFSET, b"42"), (pv.PATH, b"east"))
    assert pv.mirrored_headers((), "east", 0, 7)[-1] == (pv.PATH, b"east")


def test_second_hop_replaces_provenance_and_extends_the_path() -> None:
    first = pv.mirrored_headers((("app", b"x"),), "east", 3, 42)
    second = pv.mirrored_headers(first, "aggregate", 1, 9)
    assert second == (("app", b"x"), (pv.SOURCE_CLUSTER, b"aggregate"), (pv.SOURCE_PARTITION, b"1"),
                      (pv.SOURCE_OFFSET, b"9"), (pv.PATH, b"east,aggregate"))
    assert pv.passed_through(second, "east") and pv.passed_through(second, "aggregate")
    assert not pv.passed_through(second, "west") and not pv.passed_through((), "east")


def test_the_tail_position_is_the_last_record_of_the_partition_in_target_order() -> None:
    def rec(offset: int, cluster: str, partition: int, source_offset: int, epoch: int = -1,
            topic_id: str | None = None) -> Record:
        return Record(offset, 0, None, b"v", pv.mirrored_headers((), cluster, partition, source_offset, topic_id, epoch))

    fence = Record(5, 0, None, None, ((pv.FENCE, b"w1"),))
    tail = [rec(0, "east", 2, 10), rec(1, "east", 2, 11), rec(2, "west", 2, 99), rec(3, "east", 1, 50), fence]
    assert pv.last_mirrored(tail, "east", 2) == (MirroredPosition(11, None, -1), [])
    assert pv.last_mirrored(tail, "east", 1)[0] == MirroredPosition(50, None, -1)
    assert pv.last_mirrored([fence], "east", 2) == (None, [])
    assert pv.is_fence(fence) and not pv.is_fence(tail[0])
    assert pv.source_position(tail[2], "east") is None
    assert pv.source_position(Record(0, 0, None, b"", ((pv.SOURCE_CLUSTER, b"east"), (pv.SOURCE_PARTITION, b"x"),
                                                      (pv.SOURCE_OFFSET, b"1"))), "east") is None
    # After a divergence (offsets 12..13 of epoch 3 no longer at the source) the source's
    # offsets 12.. of epoch 4 follow: the last in target order counts, not the highest.
    old, new = uuid.uuid4(), uuid.uuid4()
    a, b = history.topic_id_text(old), history.topic_id_text(new)
    diverged = [rec(0, "east", 0, 10, 2, a), rec(1, "east", 0, 11, 3, a), rec(2, "east", 0, 12, 3, a),
                rec(3, "east", 0, 13, 3, a), rec(4, "east", 0, 12, 4, a)]
    assert pv.last_mirrored(diverged, "east", 0) == (MirroredPosition(12, old, 4), [(2, 10), (3, 11), (4, 12)])
    # A new incarnation of the topic: its offset 0 follows the old one's 13.
    recreated = diverged[:4] + [rec(4, "east", 0, 0, 0, b)]
    assert pv.last_mirrored(recreated, "east", 0) == (MirroredPosition(0, new, 0), [(0, 0)])
    assert pv.incarnation_of(recreated[-1]) == (new, 0)
    assert history.parse_topic_id(b) == new and history.parse_topic_id("not base64!") is None


def test_checkpoint_records_round_trip() -> None:
    cp = Checkpoint("app", "east", "pageviews", 3, 1000, "east.pageviews", 1001, 123)
    assert Checkpoint.parse(cp.value()) == cp
    assert cp.key == b"app/east/pageviews/3"


def test_flow_config_keys_are_checked() -> None:
    flow = MirrorSpec("f", "east", "aggregate", "pageviews",
                      config={"topic.refresh.ms": "2000", "producer.linger.ms": "10", "http.port.base": "9000"})
    c = WorkerConfig.from_flow(flow)
    assert (c.topic_refresh_s, c.producer, c.http_port_base) == (2.0, {"linger.ms": "10"}, 9000)
    try:
        WorkerConfig.from_flow(MirrorSpec("f", "east", "aggregate", "x", config={"topic.refresh": "1"}))
    except ValueError as exc:
        assert "unknown config 'topic.refresh'" in str(exc)
    else:
        raise AssertionError("an unknown flow config key was accepted")
