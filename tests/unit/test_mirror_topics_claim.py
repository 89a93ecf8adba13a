"""A mirror-topics worker claiming a partition (mirror/mirror_topics.py `_claim`) while the
group takes it away.

In the mirror fault test, with the source cluster's group coordinator moving, the worker
was re-claiming orders-2 (its first claim had failed) when a rebalance revoked it; the
claim then seeked the consumer to a partition it no longer had, and the KeyError ended
the worker."""

from __future__ import annotations

import collections
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from cluster.common.clock import SYSTEM_CLOCK
from mirror import mirror_topics
from mirror.core import topic_copy
from mirror.flow_control import FlowPause
from mirror.mirror_topics import CLAIMING, TopicMirrorWorker, TopicPartitionMirror

SOURCE = ("orders", 2)


class Consumer:
    def __init__(self) -> None:
        self.seeks: list[tuple[tuple[str, int], int]] = []

    def seek(self, tp: tuple[str, int], offset: int) -> None:
        self.seeks.append((tp, offset))

    def resume(self, *tps: tuple[str, int]) -> None:
        pass


def worker() -> TopicMirrorWorker:
    w = TopicMirrorWorker.__new__(TopicMirrorWorker)  # only what _claim reads
    w.name, w.target_name = "east-to-dr-w0", "dr"
    w.metrics = {"claims": 0, "data_loss_records": 0}
    w.partitions = {}
    w._consumer = Consumer()  # type: ignore[assignment]
    w._source_admin = SimpleNamespace(cluster="east")  # type: ignore[assignment]
    w._target_admin = SimpleNamespace(cluster="dr")  # type: ignore[assignment]
    w._reclaim = trio.Event()
    w._target_ids = {}
    w.flow_pause = FlowPause("east-to-dr")  # running: a claim resumes fetching its partition
    w.events = collections.deque(maxlen=10)
    w.clock = SYSTEM_CLOCK
    return w


def same_tails(monkeypatch: pytest.MonkeyPatch, *, differ: bool = False) -> None:
    async def batch_tail(cluster: Any, topic: str, partition: int, offset: int) -> topic_copy.BatchTail:
        await trio.lowlevel.checkpoint()
        return topic_copy.BatchTail(offset, 7 if differ and cluster == "dr" else 3, 0, False, False)

    monkeypatch.setattr(mirror_topics, "_batch_tail", batch_tail)


@pytest.mark.parametrize("revoked", [False, True])
def test_a_partition_revoked_while_its_offsets_are_read_is_not_seeked(monkeypatch: pytest.MonkeyPatch,
                                                                      revoked: bool) -> None:
    w = worker()
    pm = w.partitions[SOURCE] = TopicPartitionMirror(SOURCE, SOURCE)

    async def offsets(cluster: Any, topic: str, partition: int) -> tuple[int, int]:
        await trio.lowlevel.checkpoint()
        if revoked and cluster == "east":
            await w._on_revoke([SOURCE])  # the group's rebalance, while the claim waits
        return (100, 500) if cluster == "east" else (0, 300)

    monkeypatch.setattr(mirror_topics.tail, "offsets", offsets)
    same_tails(monkeypatch)
    trio.run(w._claim, pm)
    consumer = w._consumer
    assert isinstance(consumer, Consumer)
    if revoked:
        assert consumer.seeks == [] and pm.state == CLAIMING and SOURCE not in w.partitions
    else:
        assert consumer.seeks == [(SOURCE, 300)] and pm.state == mirror_topics.ACTIVE


@pytest.mark.parametrize("differ", [True, False])
def test_a_copy_whose_last_batch_is_not_the_sources_is_failed_not_extended(monkeypatch: pytest.MonkeyPatch,
                                                                            differ: bool) -> None:
    """The target ends below the source's high watermark but its last batch is another one
    than the source holds there (a failover cut a promotion short, then the old primary was
    marked a copy): appending after it would join two histories. FAILED, for an operator."""
    w = worker()
    pm = w.partitions[SOURCE] = TopicPartitionMirror(SOURCE, SOURCE)

    async def offsets(cluster: Any, topic: str, partition: int) -> tuple[int, int]:
        await trio.lowlevel.checkpoint()
        return (100, 500) if cluster == "east" else (0, 300)

    monkeypatch.setattr(mirror_topics.tail, "offsets", offsets)
    same_tails(monkeypatch, differ=differ)
    trio.run(w._claim, pm)
    consumer = w._consumer
    assert isinstance(consumer, Consumer)
    if differ:
        assert consumer.seeks == [] and pm.state == mirror_topics.FAILED and "histories differ" in pm.last_error
    else:
        assert consumer.seeks == [(SOURCE, 300)] and pm.state == mirror_topics.ACTIVE
