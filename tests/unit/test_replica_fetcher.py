"""ReplicaFetcher's loop: it must yield and obey stop() whatever its partitions look like."""

from __future__ import annotations

from typing import Any

import trio

from cluster.replication.fetcher import ReplicaFetcher
from cluster.replication.partition import Partition


def test_a_fetcher_left_with_partitions_it_no_longer_follows_waits_and_stops() -> None:
    """Regression: a partition this broker just became leader of has no follower state, and
    a fetcher still holding only such partitions span without ever awaiting — stop() could
    not cancel it and the whole broker froze (found by the hard-bounce fault test)."""
    replicas: Any = None  # never touched while there is nothing to fetch
    fetcher = ReplicaFetcher(replicas, leader_id=2)
    part = Partition("t", 0, log=None)  # type: ignore[arg-type]
    part.follower = None
    fetcher.partitions = {("t", 0): part}

    async def main() -> None:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fetcher.run)
                await trio.sleep(0.2)  # the loop must leave the scheduler to us
                fetcher.stop()

    trio.run(main)
    assert fetcher.partitions == {}
