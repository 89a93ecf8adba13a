"""The consumer starts fetching from a partition's new leader whichever of its tasks learnt of
it: the metadata of a consumer is refreshed by its metadata task, and also by its group's
heartbeat loop (every metadata.max.age.ms), a failed fetch and position lookups.

This was tests/mirror/test_history.py's flake (the unclean election test): broker 1, the
only replica in sync, was killed; the consumer's metadata said no leader; the group's
heartbeat loop refreshed, learnt broker 2 led after an election, and kept refreshing about
every metadata.max.age.ms. The metadata task only started fetchers after refreshes of its
own, and made those only when it found the metadata stale or a partition leaderless: it found
neither, so nothing was fetched from broker 2 for as long as the heartbeat loop's refreshes
happened to come before the metadata task's looks (46 s to more than 65 s in the lab).

A fake cluster (no broker): Metadata answers name the leader of the moment, Fetches are
recorded and never answered.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from cluster.client.consumer import Consumer
from cluster.protocol.api_keys import ApiKey

TOPIC_ID = uuid.UUID(int=0x1234)
TP = ("events", 0)


class _Pending:
    async def wait(self, timeout_s: float | None = None) -> Any:
        await trio.sleep_forever()


class _FakeConnection:
    closed = False
    versions = {int(ApiKey.FETCH): (0, 12)}

    def __init__(self, node: int, cluster: _FakeCluster) -> None:
        self.node = node
        self.cluster = cluster
        self.address = f"fake-broker-{node}:9092"

    async def request(self, api_key: int, body: Any, **_: Any) -> Any:
        assert api_key == ApiKey.METADATA
        return self.cluster.metadata_answer()

    async def send(self, api_key: int, body: Any, **_: Any) -> _Pending:
        assert api_key == ApiKey.FETCH
        self.cluster.fetches.append((self.node, trio.current_time()))
        return _Pending()


class _FakeCluster:
    """Brokers 1-3; `leader` of events-0 as the controller has it right now."""

    def __init__(self) -> None:
        self.leader, self.epoch = -1, 1
        self.fetches: list[tuple[int, float]] = []

    def metadata_answer(self) -> Any:
        partition = SimpleNamespace(partition_index=0, leader_id=self.leader, leader_epoch=self.epoch,
                                    replica_nodes=[1, 2], isr_nodes=[self.leader] if self.leader >= 0 else [1],
                                    error_code=0 if self.leader >= 0 else 5)
        topic = SimpleNamespace(name="events", error_code=0, topic_id=TOPIC_ID, partitions=[partition])
        return SimpleNamespace(brokers=[SimpleNamespace(node_id=n, host="fake", port=9092) for n in (1, 2, 3)],
                               controller_id=4, cluster_id="fake", topics=[topic])


def test_a_leader_another_task_learnt_of_is_fetched_from_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeCluster()

    async def main() -> None:
        consumer = Consumer({"bootstrap.servers": "fake:9092", "metadata.max.age.ms": 1000,
                             "auto.offset.reset": "none"})

        async def any_connection() -> _FakeConnection:
            return _FakeConnection(3, fake)

        async def connection(node_id: int, lane: str = "data") -> _FakeConnection:
            return _FakeConnection(node_id, fake)

        monkeypatch.setattr(consumer.cluster, "any_connection", any_connection)
        monkeypatch.setattr(consumer.cluster, "connection", connection)
        async with consumer:
            consumer.assign([TP])
            consumer.seek(TP, 250)
            await trio.sleep(5)  # no leader: the metadata task looks again and again
            assert consumer.cluster.metadata.leader(*TP) == -1
            assert fake.fetches == []

            # Broker 2 is elected. Another task (as the group's heartbeat loop does, every
            # metadata.max.age.ms) refreshes first, then keeps the metadata fresh.
            fake.leader, fake.epoch = 2, 2
            elected_at = trio.current_time()
            with trio.move_on_after(20):
                while not fake.fetches:
                    await consumer.cluster.refresh()
                    await trio.sleep(0.5)
            assert fake.fetches, "nothing fetched from broker 2 within 20 s of learning it leads"
            node, at = fake.fetches[0]
            assert node == 2
            assert at - elected_at < 0.1, f"broker 2 was first asked {at - elected_at:.2f} s after it was known to lead"

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
